"""The Spark job's settings: ``panjoin pipeline``'s flags (:mod:`spark_conn.cli`), and
what the job opens its join on the manager with.

``max_latency_ms`` (``--max-latency MS``) goes to the manager's engine with the join
(``OpenRequest.max_latency_ms``: the engine sizes its batches to hold the bound, see
:mod:`panjoin.manager.latency`)::

    >>> PipelineConfig("b:9092", "m:50050", "ckpt", "time:1000,1000", "eq").open_settings()
    {'allowed_lateness': 0, 'batch_size': 32768, 'key_dtype': 'int64'}
"""

from __future__ import annotations

from dataclasses import dataclass, field

from panjoin.security import Security


@dataclass
class PipelineConfig:
    bootstrap: str
    manager: str
    checkpoint: str
    window: str
    predicate: str
    r_topic: str = "R"
    s_topic: str = "S"
    out_topic: str = "joined"
    late_topic: str = "late"
    dead_letter_topic: str = "dead-letter"
    key_field: str = "key"
    ts_field: str = "ts"
    id_field: str = "id"
    key_type: str = "int64"
    index: str = "auto"
    allowed_lateness: int = 0
    subwindow_size: int | None = None
    partitions: int | None = None
    batch_size: int = 32768
    max_offsets_per_trigger: int | None = None
    starting_offsets: str = "earliest"
    trigger: str = "available-now"
    source: str = "python"
    #: jars for spark.jars (``--spark-jars``): Spark's Kafka connector for source "native"
    spark_jars: tuple = ()
    idle_timeout: float | None = None  # s without records before a partition stops holding W
    manager_timeout: float = 60.0  # s to wait for a lost manager to come back
    extra_open: dict = field(default_factory=dict)
    #: librdkafka client properties for every Kafka client the job opens (TLS, SASL;
    #: see panjoin.kafka.options), and for Spark's source as kafka.* options
    kafka_options: dict = field(default_factory=dict)
    #: the bound the manager's engine holds pair latency to (its batches), in ms
    max_latency_ms: float | None = None
    #: how the job reaches the manager: TLS, token, message limit (panjoin.security)
    security: Security = field(default_factory=Security)
    #: serve Prometheus metrics on 127.0.0.1 at this port (0: any free one); None: none
    metrics_port: int | None = None
    #: cut a stream's batch once the other stream got this many tuples (OpenRequest.max_lag)
    max_lag: int | None = None

    def __post_init__(self):
        if self.max_latency_ms is not None:
            if not self.max_latency_ms > 0:
                raise ValueError(f"max latency must be a positive number of ms, got "
                                 f"{self.max_latency_ms}")
        if self.max_lag is not None and not self.max_lag > 0:
            raise ValueError(f"max lag must be a positive number of tuples, got {self.max_lag}")

    def open_settings(self) -> dict:
        s = {"allowed_lateness": self.allowed_lateness, "batch_size": self.batch_size,
             "key_dtype": self.key_type}
        if self.subwindow_size:
            s["subwindow_size"] = self.subwindow_size
        if self.partitions:
            s["partitions"] = self.partitions
        if self.max_latency_ms is not None:
            s["max_latency_ms"] = self.max_latency_ms
        if self.max_lag is not None:
            s["max_lag"] = self.max_lag
        s.update(self.extra_open)
        return s
