"""Evaluation: the STS scorer, SentEval's transfer tasks, the config-driven jobs of evaluate.py, template and head
searches (PromptBERT's templates, Ditto's heads), and the papers' analyses (anisotropy, alignment and uniformity, the
[MASK]'s top tokens, cosine-gold scatter plots). The STS scorer is exported here."""

from jaxemb.evaluation.sts import (StsResult, SubsetScore, TaskScore, cosine, evaluate_sts,
                                   stsb_dev_spearman)
