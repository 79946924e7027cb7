"""Dotted config fields and the closest names an unknown one gets (jaxemb/config_fields.py)."""

from configs import promptbert
from jaxemb import config_fields


def test_unknown_fields_name_their_group_and_the_closest_fields():
  config = promptbert.get_config()
  assert config_fields.unknown_field(config, "train.batch_size") is None
  assert config_fields.unknown_field(config, "train") is None
  assert config_fields.unknown_field(config, "train.batchsize") == (
    "no field 'batchsize' in config.train (did you mean 'batch_size'?)"
  )
  assert config_fields.unknown_field(config, "trian.batch_size") == "no field 'trian' in config (did you mean 'train'?)"
  assert config_fields.unknown_field(config, "train.batch_size.x") == (
    "config.train.batch_size is a value (int), not a group of fields"
  )
  message = config_fields.unknown_field(config, "model.zzzzzz")
  assert message.startswith("no field 'zzzzzz' in config.model (its fields: ") and "path" in message
