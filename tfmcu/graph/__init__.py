"""The one graph IR and its lowerings: from a spec, a tf_keras model or any .tflite; shared block naming."""
