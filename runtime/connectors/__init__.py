"""Sources and sinks for real systems, on the transactional sink contract.

Each lives in its own module and imports its client library there, so ``import
runtime`` needs none of them (``pip install absflow[connectors]`` brings them):

* `runtime.connectors.postgres.PostgresSink` - PostgreSQL, two-phase commit (psycopg 3)
* `runtime.connectors.delta.DeltaSink` - Delta Lake tables (deltalake / delta-rs)
* `runtime.connectors.parquet.ParquetSink` - Parquet part files (pyarrow)
* `runtime.connectors.files.FileStreamSource` - a directory or glob on any fsspec URL,
  watched for new files (JSON lines, CSV, Parquet)
"""
