"""The IO layer: the column contract, the shard store, and files written whole or not at all.

Every other module reads and writes through here:

- :mod:`toprcli.shards.schema`: the samples / scored / curated column contract and its validator;
- :mod:`toprcli.shards.store`: shard files (atomic, so a shard that exists is complete), readers,
  manifests, the streaming Parquet writer, file metadata such as the ``sampling`` record;
- :mod:`toprcli.shards.files`: atomic text/JSON writes, directory swaps, writability checks,
  one-writer locks, and permission/disk errors as one line.

Callers use the package's names (``shards.write_shard``), so a test can patch one place.
"""

from toprcli.shards.files import (
    build_dir_beside,
    check_not_an_input,
    fsync_dir,
    check_output_dir,
    check_writable,
    disk_full_named,
    lock_holder,
    output_error,
    output_lock,
    read_json,
    read_jsonl_records,
    remove_stale_lock,
    remove_stale_temporaries,
    swap_dir_into_place,
    through_link,
    write_atomic,
    write_json_atomic,
    json_safe,
    write_text_atomic,
)
from toprcli.shards.schema import (
    CURATED_FIELDS,
    CURATED_SCHEMA,
    SAMPLES_FIELDS,
    SAMPLES_SCHEMA,
    SCHEMAS,
    SCORED_FIELDS,
    SCORED_SCHEMA,
    VERDICTS,
    check_nulls,
    conform,
    validate_columns,
)
from toprcli.shards.store import (
    MANIFEST_NAME,
    METADATA_KEY,
    SHARD_PATTERN,
    changed_keys,
    changes,
    check_finished,
    complete_shards,
    fingerprint,
    model_identity,
    models_of,
    same_model,
    iter_shards,
    made_from,
    parquet_files,
    read_file_metadata,
    read_manifest,
    read_schema,
    read_table,
    sampling_of,
    shard_name,
    value_at,
    versions,
    write_manifest,
    write_shard,
    write_table_atomic,
    write_table_stream,
)

__all__ = [
    "read_jsonl_records",
    "remove_stale_lock",
    "lock_holder",
    "disk_full_named",
    "check_not_an_input",
    "read_json",
    "CURATED_FIELDS", "CURATED_SCHEMA", "MANIFEST_NAME", "METADATA_KEY", "SAMPLES_FIELDS", "SAMPLES_SCHEMA", "SCHEMAS",
    "SCORED_FIELDS", "SCORED_SCHEMA", "SHARD_PATTERN", "VERDICTS", "build_dir_beside", "changed_keys", "changes", "value_at", "check_finished", "check_nulls", "check_output_dir", "check_writable", "complete_shards", "conform",
    "fingerprint", "fsync_dir", "model_identity", "models_of", "same_model", "iter_shards", "made_from", "output_error", "output_lock", "parquet_files", "read_file_metadata", "read_manifest",
    "read_schema", "read_table", "remove_stale_temporaries", "sampling_of", "shard_name", "swap_dir_into_place", "through_link",
    "validate_columns", "versions", "write_atomic", "write_json_atomic", "json_safe", "write_manifest", "write_shard", "write_table_atomic",
    "write_table_stream", "write_text_atomic",
]
