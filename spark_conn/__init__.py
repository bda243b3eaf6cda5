"""PySpark side of PanJoin: a Kafka source and sink on Spark's Python Data Source API
(:mod:`spark_conn.kafka_source`) and the pipeline job (:mod:`spark_conn.pipeline`)."""
