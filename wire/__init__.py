"""cmdare's wire format, shared by the agent, the collector and analytics (installed as
``cmdare.wire``; standard library only, so the agent stays small):

- ``registry``: the event types (fields, units, table, high-volume, row form); ``kinds``: field kinds
- ``events``: building events (``EventFactory``), JSON lines, reading a line back
- ``rowform``: the row form of high-volume samples
- ``columns``: column blocks, the Kafka transport encoding (encoder and decoder)
- ``validation``: what makes an event valid; every dead-letter reason (``RULES``)
- ``spool``: the spool directory's on-disk format and its reader
- ``units``: durations and sizes as users write them
- ``kafka``: ``kafka://`` addresses
- ``tbevents`` / ``protowire``: TensorBoard event files and the protobuf wire encoding
- ``plugin``: the contract of pluggable units (sources, detectors, recommenders)
"""
