"""Shipping a trained model: ``seq2seq export`` writes a run's weights as a slim safetensors
directory (``safetensors.py``) or as a CTranslate2 model (``ctranslate2.py``); ``directory.py``
publishes either one atomically."""
