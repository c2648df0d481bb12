"""Building blocks with their formulas: attention (scores, masks, multi-head), dropout, the loss."""
