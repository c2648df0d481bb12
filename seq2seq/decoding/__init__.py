"""From a trained model to text: greedy and beam search, teacher-forced scoring, the Translator,
streaming translation with exports, lexical shortlists and int8 quantization."""
