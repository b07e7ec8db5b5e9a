"""The shared store's one home: its layout, its writers, its readers and its retention.

- :mod:`guardctl.storage.layout`: where everything lives under the store's root;
- :mod:`guardctl.storage.segments`: how telemetry is cut into time segments and named;
- :mod:`guardctl.storage.writer`: the append-only writer the agent and the probe share;
- :mod:`guardctl.storage.closed`: closed segments as Parquet, partitioned by kind and time;
- :mod:`guardctl.storage.store`: the store's marker, checking files, retention.
"""
