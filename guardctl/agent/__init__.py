"""The per-node telemetry agent: collectors sampled on an interval, written to the store.

:mod:`guardctl.agent.daemon` has the loop and :mod:`guardctl.agent.slot` the
per-collector timeouts and health; the never-torn, outage-tolerant store
writer it shares with :mod:`guardctl.probe` is :mod:`guardctl.storage.writer`.
"""
