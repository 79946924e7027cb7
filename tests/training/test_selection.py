"""Model selection: how each config's trainer embeds STS-B dev sentences, as the authors' trainers do."""

import importlib

import pytest

from jaxemb.encode import Method
from jaxemb.training import selection, trainer
from jaxemb.spec import TrainingRun

OF = 'This sentence of "[X]" means[MASK].'
COLON = 'This sentence : "[X]" means[MASK].'
ROBERTA = "This sentence : ' [X] ' means[MASK]."
COT = 'The sentence of "[X]" means [MASK] , so it can be summarized as [MASK] .'


def _prompt(template, **fields):
  return Method("prompt", template=template, tokenization="alone", **fields)


# Each config's selection method, read off the authors' flags: --mask_embedding_sentence_delta (bias at dev time)
# unless --mask_embedding_sentence_delta_no_delta_eval (CoT-BERT); --mlp_only_train (no head at dev time), else
# the trained MLP (`sentemb_forward` applies `cls.mlp`) or with --mask_embedding_sentence_org_mlp the MLM transform.
EXPECTED = {
  "promptbert": _prompt(OF, denoise="position_offset"),  # run.sh unsup-bert
  "promptroberta": _prompt(ROBERTA, denoise="position_offset"),  # run.sh unsup-roberta
  "promptbert_sup": _prompt(OF, denoise="position_offset", head="mlm_transform"),  # run.sh sup-bert
  # run.sh sup-roberta: the trained MLP.
  "promptroberta_sup": _prompt(ROBERTA, denoise="position_offset", head="pooler"),
  "cotbert": _prompt(COT),  # code-for-BERT/train.py
  "cotroberta": _prompt(COT.replace('"[X]"', "' [X] '") + " "),  # code-for-RoBERTa/train.py
  "simcse": Method("cls_before_pooler"),  # run_unsup_example.sh: --mlp_only_train
  "simcse_sup": Method("cls"),  # run_sup_example.sh: the MLP, kept as the pooler
  "optiprompt": _prompt(COLON),  # run.sh bert-optiprompt: --mlp_only_train, no delta
}


def _selection_method(config, tokenizer):
  run = TrainingRun.from_config(config)
  return selection.selection_method(run, trainer.build_objective(run, tokenizer))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_selection_method_follows_the_authors_flags(name, roberta_tokenizer, bert_tokenizer):
  config = importlib.import_module(f"configs.{name}").get_config()
  tokenizer = roberta_tokenizer if "roberta" in name else bert_tokenizer
  assert _selection_method(config, tokenizer) == EXPECTED[name]


def test_selection_can_use_the_evaluation_method(bert_tokenizer):
  config = importlib.import_module("configs.promptbert").get_config()
  config.eval.selection = "eval_method"
  assert _selection_method(config, bert_tokenizer) == Method("prompt", template=OF)
  config.eval.selection = "test"
  with pytest.raises(ValueError, match=r"^config\.eval\.selection='test': must be one of"):
    _selection_method(config, bert_tokenizer)


def test_selection_subtracts_the_objectives_pad_bias_when_asked(bert_tokenizer):
  """CoT-BERT's selection subtracts nothing (--mask_embedding_sentence_delta_no_delta_eval); select_denoise makes
  it subtract the objective's own [PAD] bias."""
  config = importlib.import_module("configs.cotbert").get_config()
  assert _selection_method(config, bert_tokenizer).denoise == "none"
  config.eval.select_denoise = True
  assert _selection_method(config, bert_tokenizer).denoise == "pad"


# Each config's evaluation method (recorded in its run directory), read off the authors' evaluation flags: run.sh's
# eargs (unsup: the view-1 template; sup-bert: --mask_embedding_sentence_delta --..._org_mlp; sup-roberta: delta,
# --..._use_pooler; bert-optiprompt: the ':' template with its vectors), CoT's evaluation.py (the anchor, the
# filled-in string stripped), SimCSE's evaluation.py (--pooler cls_before_pooler / cls).
EVALUATION = {
  "promptbert": Method("prompt", template=OF),
  "promptroberta": Method("prompt", template=ROBERTA),
  "promptbert_sup": Method("prompt", template=OF, denoise="position_offset", head="mlm_transform"),
  "promptroberta_sup": Method("prompt", template=ROBERTA, denoise="position_offset", head="pooler"),
  "cotbert": Method("prompt", template=COT),
  "cotroberta": Method("prompt", template=COT.replace('"[X]"', "' [X] '")),
  "simcse": Method("cls_before_pooler"),
  "simcse_sup": Method("cls"),
  "optiprompt": Method("prompt", template=COLON),
}


@pytest.mark.parametrize("name", sorted(EVALUATION))
def test_evaluation_method_follows_the_authors_evaluation_flags(name):
  config = importlib.import_module(f"configs.{name}").get_config()
  assert TrainingRun.from_config(config).method == EVALUATION[name]
  assert config.eval.add_period == (EVALUATION[name].name == "prompt")  # evaluation.py's "." for prompts only.
