"""Shipping a trained model: ``seq2seq export`` writes a run's weights as a slim safetensors
directory (``seq2seq.checkpoint.safetensors``, which every command reads back) or as a CTranslate2
model (``ctranslate2.py``), published whole by ``io_utils.atomic_directory``."""
