"""Names shared by the report's modules."""
METRICS = ("BLEU", "chrF", "TER")  # display names, in sacrebleu's order below
LOWER_IS_BETTER = {"TER"}
DEFAULT_BUCKETS = (10, 15, 20, 30)  # upper bounds: 1-10, 11-15, 16-20, 21-30, 31+
ALPHA = 0.05
DASH = "—"
