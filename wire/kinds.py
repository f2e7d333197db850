"""The kinds a data field of the wire format can have (its type on the wire, JSON Schema
and DuckDB column): numbers, strings, booleans and lists of them or of objects."""

FLOAT, INT, STR, BOOL, FLOATS, STRS, OBJS = "float", "int", "str", "bool", "float[]", "str[]", "object[]"
LIST_KINDS = (FLOATS, STRS, OBJS)
