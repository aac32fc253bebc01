"""Stage rewriters: the patch stage of an int8 .tflite as per-patch builtin ops, or as one TFMCU_PATCH_STAGE op."""
