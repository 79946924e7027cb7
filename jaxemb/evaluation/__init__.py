"""Evaluation of sentence embeddings. The STS scorer is exported here.

common    what STS and transfer share: the `Embed` and `Preprocess` types, one `embed` call over the distinct
          sentences of a set of tasks, the boxed text table
sts       SentEval's STS scorer: cosine against gold, Spearman ("all", "wmean", "mean"), results by (task, split)
logreg    SentEval's transfer classifier: the logistic regression, stratified folds, validation split, L2 search,
          and its three validation schemes (vmapped over folds and L2 weights)
transfer  SentEval's transfer tasks: each task's protocol and features, on `logreg`
run       the config-driven jobs of evaluate.py: STS, transfer, both with one encoder
evaluators  what a training run scores every so many steps (config.evals): STS, transfer dev accuracy,
          alignment and uniformity
search    STS-B dev searches: PromptBERT's templates, Ditto's layers and heads
analysis  the papers' analyses: anisotropy, alignment and uniformity, the [MASK]'s top tokens, cosine-gold plots
"""

from jaxemb.evaluation.sts import StsResult, SubsetScore, TaskScore, cosine, evaluate_sts
