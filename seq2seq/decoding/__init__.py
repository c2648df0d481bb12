"""From a trained model to text: greedy, beam and sampling search, teacher-forced scoring,
ensembles, lexical shortlists and the Translator."""
