// Grafana's own types for a classic dashboard JSON (@grafana/schema, the same package
// Grafana's frontend builds with), shaped for JSON: tests/test_grafana_schema.py writes each
// dashboard as an object literal typed with these and runs tsc, so an unknown key (a typo
// Grafana would silently ignore), a wrong type or an enum value Grafana does not know fails.
import type { Dashboard, FieldConfigSource, Panel } from '@grafana/schema';
import type * as BarGauge from '@grafana/schema/dist/esm/raw/composable/bargauge/panelcfg/x/BarGaugePanelCfg_types.gen';
import type * as Stat from '@grafana/schema/dist/esm/raw/composable/stat/panelcfg/x/StatPanelCfg_types.gen';
import type * as StateTimeline from '@grafana/schema/dist/esm/raw/composable/statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen';
import type * as Table from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen';
import type * as TimeSeries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';

// A JSON file can only hold an enum's value, never the enum: string enums become the union of
// their values (`${E}`), everything else keeps its shape.
export type Json<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends Array<infer U>
      ? Array<Json<U>>
      : T extends object
        ? { [K in keyof T]: Json<T[K]> }
        : T;

// Panel options and field config: Grafana fills defaults for what is left out, so every key
// is optional, but a key given must exist and hold a value of its type.
export type Loose<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends Array<infer U>
      ? Array<Loose<U>>
      : T extends object
        ? { [K in keyof T]?: Loose<T[K]> }
        : T;

export type CheckedDashboard = Json<Dashboard>;

// Each panel type's options and field-config `custom` as its plugin declares them.
interface PanelTypes {
  timeseries: { options: TimeSeries.Options; custom: TimeSeries.FieldConfig };
  stat: { options: Stat.Options; custom: Record<string, never> };
  bargauge: { options: BarGauge.Options; custom: Record<string, never> };
  table: { options: Table.Options; custom: Table.FieldConfig };
  'state-timeline': { options: StateTimeline.Options; custom: StateTimeline.FieldConfig };
}

type Defaults<C> = Omit<Json<FieldConfigSource['defaults']>, 'custom'> & { custom?: Loose<C> };

export type CheckedPanel<K extends keyof PanelTypes> = Omit<Json<Panel>, 'options' | 'fieldConfig' | 'type'> & {
  type: K;
  options?: Loose<PanelTypes[K]['options']>;
  fieldConfig?: Omit<Json<FieldConfigSource>, 'defaults'> & { defaults: Defaults<PanelTypes[K]['custom']> };
};
