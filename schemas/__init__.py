"""Wire format of the counter service: Avro schemas (*.avsc), the fastavro codec, JSON records, validation.

Everything that reads or writes the counter-mutations and counter-rollups topics goes through here, so a
record accepted by one component is accepted by all of them.
"""

from schemas.codec import (
    COUNT_MUTATION,
    MAGIC,
    MUTATION_BATCH,
    ROLLUP_SIGNAL,
    SCHEMAS,
    AvroSchema,
    DecodeError,
    decode_mutations,
    decode_signal,
    encode_batch,
    encode_mutation,
    encode_signal,
)
from schemas.json_records import mutation_from_json
from schemas.model import MICROS, Mutation, MutationOp
from schemas.validation import (
    INT64_MAX,
    INT64_MIN,
    MAX_COUNTER_NAME_BYTES,
    MAX_EVENT_TIME,
    MAX_ITEM_KEY_BYTES,
    MAX_NAMESPACE_LEN,
    MAX_TOKEN_BYTES,
    MIN_EVENT_TIME,
    ValidationError,
    parse_generation_time,
    validate_counter_name,
    validate_delta,
    validate_event_time,
    validate_item_key,
    validate_mutation,
    validate_namespace,
    validate_token,
)

__all__ = [
    "COUNT_MUTATION",
    "INT64_MAX",
    "INT64_MIN",
    "MAGIC",
    "MAX_COUNTER_NAME_BYTES",
    "MAX_EVENT_TIME",
    "MAX_ITEM_KEY_BYTES",
    "MAX_NAMESPACE_LEN",
    "MAX_TOKEN_BYTES",
    "MICROS",
    "MIN_EVENT_TIME",
    "MUTATION_BATCH",
    "ROLLUP_SIGNAL",
    "SCHEMAS",
    "AvroSchema",
    "DecodeError",
    "Mutation",
    "MutationOp",
    "ValidationError",
    "decode_mutations",
    "decode_signal",
    "encode_batch",
    "encode_mutation",
    "encode_signal",
    "mutation_from_json",
    "parse_generation_time",
    "validate_counter_name",
    "validate_delta",
    "validate_event_time",
    "validate_item_key",
    "validate_mutation",
    "validate_namespace",
    "validate_token",
]
