"""seq2seq: attention-based neural machine translation, RNN and Transformer side by side."""
__version__ = "0.1.0"
