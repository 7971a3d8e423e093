"""Metric families, one module per collector of the contract (node_exporter style).

gpu, health, xid, nvlink, profiling, mig, processes, kubernetes, host: each turns a
snapshot's samples into its families; status: the exporter's own (build info, collector
success and duration); registry: the list of them and ResourceCollector. series: the label
and sample helpers they share.
"""
