"""Kafka: start a local broker (:mod:`.broker`), move event files and results
between files and topics (:mod:`.io`). The project speaks the protocol itself for
bulk reads and writes (:mod:`.protocol`, :mod:`.record_batch`, :mod:`.fetcher`,
:mod:`.writer`); librdkafka's clients (:mod:`.librdkafka`) serve the rest, configured
by the user's properties (:mod:`.options`). The Spark side is in ``spark_conn/``."""
