"""The registry of method families and the flat `config.method` block every config and run directory holds."""

import dataclasses
import pickle

import pytest

from jaxemb import bias_removal, methods
from jaxemb.methods import Method, base
from jaxemb.models import run_dir

PROMPT = 'This sentence : "[X]" means [MASK] .'
# The flat block as configs and eval_method.json files have held it: its keys must stay (a new family adds its own).
FLAT_FIELDS = {
  "name",
  "template",
  "top_k",
  "ditto_layer",
  "ditto_head",
  "ditto_variant",
  "idf_path",
  "denoise",
  "head",
  "tokenization",
  "bias_positions",
  "prompt_placement",
  "static_rows",
  "remove_frequent",
  "remove_subwords",
  "lowercase",
  "remove_punctuation",
}
# Every registered method, and one of each family with fields away from their defaults.
METHODS = [Method(name) for name in methods.names()] + [
  Method("cls_before_pooler", tokenization="alone"),
  Method(
    "prompt",
    template=PROMPT,
    denoise=True,
    head="mlm_transform",
    bias_positions="model",
    prompt_placement="template",
    tokenization="alone",
  ),
  Method("prompt_mlm_top_k", template=PROMPT, top_k=7, denoise=True),
  Method("ditto_all_heads", ditto_layer=2, ditto_head=0, ditto_variant="static"),
  Method("static_avg", static_rows="mlm_decoder"),
  Method("static_remove_biases", bias_filter=bias_removal.BiasFilter(lowercase=False, remove_frequent=False)),
  Method("tfidf_first_last", idf_path="idf.json"),
]


def test_every_method_of_the_papers_is_registered_in_order():
  # The families a new module registers come after these.
  assert methods.names()[:13] == (
    "cls",
    "cls_before_pooler",
    "last_avg",
    "first_last_avg",
    "first_layer_last_avg",
    "top2_avg",
    "static_avg",
    "static_remove_biases",
    "ditto",
    "ditto_all_heads",
    "tfidf_first_last",
    "prompt",
    "prompt_mlm_top_k",
  )
  assert methods.exportable_names() == ("cls", "cls_before_pooler", "last_avg", "prompt")


@pytest.mark.parametrize("method", METHODS, ids=repr)
def test_config_fields_round_trip_through_from_config(method):
  fields = method.config_fields()
  assert FLAT_FIELDS <= set(fields) == {"name", *base.block_defaults()}
  assert Method.from_config(fields) == method
  assert Method.from_config({"name": method.name, **method.changed_fields()}) == method
  assert hash(method) == hash(Method.from_config(fields))  # A static jit argument.
  assert pickle.loads(pickle.dumps(method)) == method


def test_a_family_builds_its_own_names_only():
  assert isinstance(Method("ditto"), methods.ditto.Ditto) and isinstance(Method("ditto"), Method)
  assert methods.pooled.Pooled("last_avg") == Method("last_avg")
  with pytest.raises(ValueError, match=r"^method 'ditto' is not one of \('cls', "):
    methods.pooled.Pooled("ditto")
  # dataclasses.replace stays within the family (the ditto head search's way to every head).
  assert dataclasses.replace(Method("ditto", ditto_head=3), name="ditto_all_heads") == Method(
    "ditto_all_heads", ditto_head=3
  )


def test_an_unknown_method_is_refused_naming_every_method():
  for build in (lambda: Method("pooled"), lambda: Method.from_config({"name": "pooled"})):
    with pytest.raises(ValueError, match=r"^method 'pooled' is not one of \('cls', .*'prompt_mlm_top_k'.*\)$"):
      build()


@pytest.mark.parametrize(
  "name, fields, message",
  [
    (
      "last_avg",
      {"template": PROMPT},
      f"method 'last_avg' takes no template (a field of prompt, prompt_mlm_top_k only); got template={PROMPT!r}",
    ),
    ("prompt", {"top_k": 7}, "method 'prompt' takes no top_k (a field of prompt_mlm_top_k only); got top_k=7"),
    (
      "prompt_mlm_top_k",
      {"head": "pooler"},
      "method 'prompt_mlm_top_k' takes no head (a field of prompt only); got head='pooler'",
    ),
    (
      "static_avg",
      {"lowercase": False},
      "method 'static_avg' takes no lowercase (a field of static_remove_biases only); got lowercase=False",
    ),
    (
      "ditto",
      {"idf_path": "idf.json"},
      "method 'ditto' takes no idf_path (a field of tfidf_first_last only); got idf_path='idf.json'",
    ),
    ("last_avg", {"pooling": "max"}, "method 'last_avg' takes no pooling (no method's field); got pooling='max'"),
    (
      "last_avg",
      {"whitened_method": "prompt"},
      "method 'last_avg' takes no whitened_method (a field of whitening only); got whitened_method='prompt'",
    ),
    (
      "static_remove_biases",
      {"lowercase": False},
      "method 'static_remove_biases' takes lowercase in a config block, not as a Python argument (its arguments: "
      "bias_filter, static_rows, tokenization); got lowercase=False",
    ),
    (
      "whitening",
      {"tokenization": "alone"},
      "method 'whitening' takes tokenization in a config block, not as a Python argument (its arguments: "
      "whitened_method, whitening_corpus, whitening_dims); got tokenization='alone'",
    ),
    (
      "whitening",
      {"whitened": "prompt"},
      "method 'whitening' takes no whitened (no method's field; did you mean whitened_method or whitening_dims?); "
      "got whitened='prompt'",
    ),
    (
      "flow",
      {"flowed": "cls"},
      "method 'flow' takes no flowed (no method's field; did you mean flowed_method or flow_seed or flow_width?); "
      "got flowed='cls'",
    ),
  ],
)
def test_a_misplaced_field_is_refused_in_one_line(name, fields, message):
  """By its name, dataclass field or flat field. A field of a family's flat block that is not a Python argument
  (static_remove_biases's switches are flat forms of its bias_filter, a transform's block holds its source method's
  fields) is said to be one; an unknown one names the family's closest arguments, a prefix first."""
  with pytest.raises(ValueError) as raised:
    Method(name, **fields)
  assert str(raised.value) == message and "\n" not in message


def test_a_config_block_hands_the_family_only_the_fields_away_from_their_defaults():
  """A block naming one method carries every family's fields; those at their defaults are no method's own."""
  block = {**Method("ditto").config_fields(), "name": "prompt", "template": PROMPT}
  assert Method.from_config(block) == Method("prompt", template=PROMPT)
  with pytest.raises(ValueError, match="^method 'prompt' takes no ditto_head"):
    Method.from_config({**block, "ditto_head": 3})
  with pytest.raises(ValueError, match=r"^config.method has no fields \['pooling'\]"):
    Method.from_config({**block, "pooling": "max"})


def test_an_old_partial_eval_method_json_still_loads():
  """A run directory's eval_method.json written before it held every field has 7; an older static one none of the
  bias switches."""
  seven = {
    "name": "prompt_mlm_top_k",
    "template": PROMPT,
    "denoise": True,
    "head": "none",
    "tokenization": "alone",
    "bias_positions": "from_zero",
    "prompt_placement": "last_occurrence",
  }
  assert (
    Method.from_config(seven)
    == Method(**seven)
    == Method("prompt_mlm_top_k", template=PROMPT, denoise=True, tokenization="alone")
  )
  assert Method.from_config({"name": "static_remove_biases", "lowercase": False}) == Method(
    "static_remove_biases", bias_filter=bias_removal.BiasFilter(lowercase=False)
  )
  assert Method.from_config({"name": "last_avg", "idf_path": ""}) == Method("last_avg")


def test_eval_method_json_files_written_before_the_families_load(tmp_path):
  """Every field as `config_fields` wrote them (the static switches flat, no idf_path as ""), read back from a run
  directory."""
  old = {
    "name": "static_remove_biases",
    "template": "[X]",
    "top_k": 200,
    "ditto_layer": 0,
    "ditto_head": 9,
    "ditto_variant": "first_last",
    "idf_path": "",
    "denoise": False,
    "head": "none",
    "tokenization": "in_context",
    "bias_positions": "from_zero",
    "prompt_placement": "last_occurrence",
    "static_rows": "word_embeddings",
    "remove_frequent": True,
    "remove_subwords": False,
    "lowercase": True,
    "remove_punctuation": True,
  }
  run_dir.save_eval_method(tmp_path, old)
  method = Method.from_config(run_dir.load_eval_method(tmp_path))
  assert method == Method("static_remove_biases", bias_filter=bias_removal.BiasFilter(remove_subwords=False))
  # Families added since at their defaults; denoise as it is named now.
  assert method.config_fields() == {**base.block_defaults(), **old, "denoise": "none"}


def test_a_family_that_clashes_with_the_registry_is_refused():
  @dataclasses.dataclass(frozen=True, kw_only=True)
  class Clash(base.Tokenized):
    NAMES = ("last_avg",)

  @dataclasses.dataclass(frozen=True, kw_only=True)
  class OtherDefault(base.Tokenized):
    NAMES = ("other_default",)
    top_k: int = 5

  with pytest.raises(ValueError, match=r"methods \['last_avg'\] are registered already"):
    base.register(Clash)
  with pytest.raises(ValueError, match=r"give the fields \['top_k'\] different defaults"):
    base.register(OtherDefault)
  assert "other_default" not in methods.names()
