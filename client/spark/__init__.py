"""`kafka-share` for PySpark: a streaming source reading a share group and a sink producing to a topic.

Importing this package registers the format in the active SparkSession; `register(spark)` does it for a
session created later.
"""

from .options import SparkOptionError
from .source import FORMAT_NAME, KafkaShareDataSource, register

__all__ = ["FORMAT_NAME", "KafkaShareDataSource", "SparkOptionError", "register"]
