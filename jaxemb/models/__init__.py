"""The encoder (BERT/RoBERTa/ELECTRA), its heads and Hugging Face checkpoint I/O."""

from jaxemb.models.bert import EncoderOutput, Transformer, default_position_ids
from jaxemb.models.config import EncoderConfig, compute_dtype
from jaxemb.models.hf import load_pretrained, load_tokenizer, save_pretrained
from jaxemb.models.hf_keys import CheckpointError
