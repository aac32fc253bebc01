"""TFLite files: the flatbuffer schema, the one model editor, offline memory plans, TFLite Support metadata."""
