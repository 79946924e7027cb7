import pytest

from jaxemb.errors import ConfigError
from jaxemb.evaluation import common


@pytest.mark.parametrize(
  "text", ["STS12,STSBenchmark", " STS12 , STSBenchmark ,", "('STS12', 'STSBenchmark')", '["STS12","STSBenchmark"]']
)
def test_task_names_read_a_comma_separated_list_or_a_python_tuple_of_them(text):
  assert common.task_names(text, "eval.tasks", known=["STS12", "STSBenchmark"]) == ["STS12", "STSBenchmark"]


def test_an_unknown_or_missing_task_is_one_config_error():
  with pytest.raises(ConfigError, match=r"^eval.tasks: unknown tasks \['STS99'\]; known: \['STS12'\]$"):
    common.task_names("('STS12', 'STS99')", "eval.tasks", known=["STS12"])
  with pytest.raises(ConfigError, match=r"^eval.tasks: names no task$"):
    common.task_names("()", "eval.tasks", known=["STS12"])
  assert common.task_names("", "eval.tasks", allow_none=True) == []
