"""Telemetry as written: the schema, the column layout, the column mirrors, the store writer.

Everything a writer of telemetry needs, and nothing an analysis needs, so that
a training rank that imports :mod:`guardctl.probe` loads neither the analyzer
nor numpy (a test keeps it so):

- :mod:`guardctl.telemetry.schema`: interchange schema v1, its one field list,
  validation and reading;
- :mod:`guardctl.telemetry.columns`: the column layout derived from that list,
  and its fingerprint;
- :mod:`guardctl.telemetry.mirror`: the column-mirror format and its writer;
- :mod:`guardctl.storage.writer`: the append-only store writer of the agent
  and the probe.

Reading mirrors into the analyzer's columns is :mod:`guardctl.analyze.mirrors`.
"""
