"""The collector's ingest path, one module per step (the transaction that ties them
together is ``cmdare.collector.writer``):

- ``batch``: messages read into lines and Arrow column blocks (Python, any thread)
- ``json_sql``: JSON lines -> typed rows with a reason
- ``row_sql``: row-form lines -> typed rows with a reason
- ``block_sql``: column blocks -> typed rows with a reason, and the fast path for clean blocks
- ``typed``: one type's rows from every encoding, put together
- ``dead_letters``: the one place that writes ``dead_letters``
- ``nodes``: the one place that upserts ``nodes``
- ``sql``: helpers the SQL modules share
- ``storage``: how a type's fields are stored (GPU samples: packed, read through a view)

Every reason is rendered from ``cmdare.wire.validation.RULES``.
"""
