"""Looking into models and outputs: alignments (export, AER), attribution, sacrebleu evaluation,
plots and the side-by-side comparison report."""
