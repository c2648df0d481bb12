"""The model artifact, below everything that reads it: ``file`` (.pt checkpoints written atomically
and loaded without unpickling code; the run directory's file names), ``safetensors`` (the exported,
pickle-free directory), ``loaded`` (checkpoint -> config + tokenizer + model, once), ``kept`` (the
best / newest snapshots of a run) and ``average`` (``seq2seq average``)."""
