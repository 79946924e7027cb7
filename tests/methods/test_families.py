"""What each family owns besides its vectors (those are checked against HF PyTorch in tests/test_encode.py): its
checks, the encoder outputs it asks for, its width, the weights it needs, its export form, card and MTEB rule."""

import json
import re

import numpy as np
import pytest

from jaxemb import views
from jaxemb.errors import ConfigError
from jaxemb.methods import Method, NotExportable, prompt
from jaxemb.models import EncoderConfig
from jaxemb.templates import Template

PROMPT = 'This sentence : "[X]" means [MASK] .'
ELECTRA = EncoderConfig(
  model_type="electra",
  vocab_size=100,
  hidden_size=64,
  num_hidden_layers=2,
  num_attention_heads=4,
  intermediate_size=128,
  max_position_embeddings=64,
  embedding_size=32,
)


def test_forward_outputs_are_just_what_the_vectors_read():
  assert Method("last_avg").forward_outputs() == {"output_hidden_states": False}
  assert Method("first_last_avg").forward_outputs() == {"output_hidden_states": True}
  assert Method("ditto", layer=1).forward_outputs() == {"output_hidden_states": True, "output_attentions": (1,)}
  assert Method("tfidf_first_last").forward_outputs() == {"output_hidden_states": True}


@pytest.mark.parametrize(
  "method, shape",
  [
    (Method("last_avg"), (64,)),
    (Method("static_avg"), (32,)),
    (Method("static_remove_biases"), (32,)),
    (Method("ditto", variant="static"), (32,)),
    (Method("ditto"), (64,)),
    (Method("ditto_all_heads", variant="static"), (4, 32)),
    (Method("prompt", template=PROMPT), (64,)),
    (Method("whitening", source="static_avg"), (32,)),
    (Method("whitening", source="static_avg", dims=8), (8,)),
    (Method("flow", source="static_avg"), (32,)),
  ],
)
def test_vector_shapes(method, shape):
  """Raw word-embedding rows are as wide as ELECTRA's embeddings (no projection), the head search's are per head; a
  transform keeps its source's width (whitening's dims cut it)."""
  assert method.vector_shape(ELECTRA) == shape


def test_weights_each_method_reads_beyond_the_encoders():
  assert Method("cls").required_weights() == {"pooler": "method 'cls'"}
  assert Method("prompt", head="mlm_transform").required_weights() == {"mlm_head": "head 'mlm_transform'"}
  assert Method("prompt", head="pooler").required_weights() == {"pooler": "head 'pooler'"}
  assert Method("last_avg").required_weights() == Method("prompt").required_weights() == {}


def test_methods_without_a_sentence_transformers_form_say_so():
  for method in (Method("first_last_avg"), Method("prompt_mlm_top_k"), Method("ditto_all_heads"), Method("static_avg")):
    assert not method.exportable
    message = (
      f"^method '{method.name}' has no sentence-transformers form here; "
      r"exportable methods: \('cls', 'cls_before_pooler', 'last_avg', 'ditto', 'prompt'\)"
    )
    with pytest.raises(NotExportable, match=message):
      method.export(None, ELECTRA, {}, None)


def test_model_card_and_mteb_rules():
  method = Method("prompt", template=PROMPT, denoise="position_offset", head="pooler")
  assert method.card_tags() == ("prompt", "promptbert") and method.remote_code and method.add_period
  assert "minus the same state of the template alone" in method.card_text()
  assert "through the pretrained pooler" in method.card_text()
  cls = Method("cls")
  assert cls.card_tags() == ("cls",) and not cls.remote_code and not cls.add_period
  assert "+ the pretrained pooler (dense + tanh)" in cls.card_text()


@pytest.mark.parametrize(
  "name, fields, message",
  [
    ("whitening", {"dims": "256"}, "method 'whitening': dims must be an int; got dims='256'"),
    ("prompt", {"template": 5}, "method 'prompt': template must be a str; got template=5"),
    ("ditto", {"layer": True}, "method 'ditto': layer must be an int; got layer=True"),
    ("flow", {"learning_rate": "1e-3"}, "method 'flow': learning_rate must be a float; got learning_rate='1e-3'"),
  ],
)
def test_a_field_of_the_wrong_type_is_refused_naming_it(name, fields, message):
  """In Python as in a config (whose spec checks the types first): not an error deep inside the method."""
  with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
    Method(name, **fields)


def test_numbers_of_numpy_or_of_the_wider_type_are_the_fields_type():
  """A layer from np.arange is an int, an int learning rate a float: the block stays JSON's."""
  assert type(Method("ditto", layer=np.int64(3)).layer) is int
  assert type(Method("flow", learning_rate=1).learning_rate) is float
  json.dumps(Method("ditto", layer=np.int64(3)).to_block())


def test_denoise_takes_trainings_kinds():
  """The prompt family's denoise is named as objective.denoise is (the bools of older files: test_legacy.py), and a
  method that takes no denoise refuses it."""
  assert Method("prompt", template=PROMPT, denoise="pad").to_block()["denoise"] == "pad"
  with pytest.raises(ValueError, match=r"denoise 'yes' is not one of \('none', 'position_offset', 'pad'\)"):
    Method("prompt", template=PROMPT, denoise="yes")
  with pytest.raises(ValueError, match=r"method 'prompt': denoise must be a str; got denoise=True$"):
    Method("prompt", template=PROMPT, denoise=True)
  with pytest.raises(ValueError, match="method 'last_avg' takes no denoise"):
    Method.from_block({"name": "last_avg", "denoise": "none"})
  with pytest.raises(NotExportable, match="denoise 'pad' has no sentence-transformers form"):
    Method("prompt", template=PROMPT, denoise="pad").check_exportable()


def test_a_template_without_one_slot_is_refused_naming_it_before_any_tokenizer():
  """Its sentence goes in one [X]: the method says so when it is built, before a model is opened."""
  for template, found in [("no slot [MASK] .", 0), ("[X] and [X] mean [MASK] .", 2)]:
    message = rf"^method 'prompt': template '{re.escape(template)}' must contain exactly one \[X\], found {found}$"
    with pytest.raises(ConfigError, match=message):
      Method("prompt", template=template)


def test_a_training_view_becomes_its_evaluation_method(bert_tokenizer):
  """Model selection's method: the view in evaluation mode, the sentence's own tokens between the template ids."""
  template = Template.parse(PROMPT, bert_tokenizer)
  view = views.View(template, denoise="position_offset", head="mlp", bias_positions="model")
  assert prompt.from_view(view, "pooler", denoised=True) == Method(
    "prompt", template=PROMPT, head="pooler", denoise="position_offset", bias_positions="model", tokenization="alone"
  )
  assert prompt.from_view(view, "none", denoised=False) == Method(
    "prompt", template=PROMPT, bias_positions="model", tokenization="alone"
  )
  cls_view = views.View(Template.parse("[X]", bert_tokenizer), pooling="cls")
  assert prompt.from_view(cls_view, "pooler", denoised=True) == Method("cls")
  assert prompt.from_view(cls_view, "mlm_transform", denoised=True) == Method("cls_before_pooler")
  assert Method("prompt", template=PROMPT, denoise="position_offset").view(template) == views.View(
    template, denoise="position_offset"
  )
