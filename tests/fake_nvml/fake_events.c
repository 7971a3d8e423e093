/*
 * Event sets and injected XID events for the fake NVML; #included at the end of
 * fake_nvml.c, so it shares its state (g, g_mu, enter/leave, DEV_ENTER).
 * Stub: filled in by the XID work.
 */

static int events_gpu_key(int idx, const char *k, const char *v) { (void)idx; (void)k; (void)v; return 0; }
static int events_key(const char *k, const char *v) { (void)k; (void)v; return 0; }
static void events_defaults(void) {}
static void events_after_reload(void) {}
static void events_on_shutdown(void) {}
