"""The per-node telemetry agent: collectors sampled on an interval, written to the store.

:mod:`guardctl.agent.daemon` has the loop, :mod:`guardctl.agent.slot` the
per-collector timeouts and health, and :mod:`guardctl.agent.writer` the
never-torn, outage-tolerant store writer (which :mod:`guardctl.probe` uses too,
hence nothing heavy is imported here).
"""
