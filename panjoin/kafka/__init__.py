"""Kafka: start a local broker (:mod:`.broker`), move event files and results
between files and topics (:mod:`.io`). The Spark side is in ``spark_conn/``."""
