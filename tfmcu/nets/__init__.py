"""Networks: the searchable block spec, published presets, the Keras builder, Keras -> int8 conversion, test zoo."""
