"""Every command quoted in README.md and docs/*.md names an entry point or module, a config file, config fields and
flags that exist: a renamed flag fails here instead of misleading a reader.

Quoted commands: the lines of fenced bash blocks (`\\` continuations joined, `#` comments dropped) and inline code
that starts with `python`, with an entry point (`train.py --config ...`) or with a config file's name followed by
its fields (`eval_ditto.py --config.method.layer=0`, short for `evaluate.py --config configs/eval_ditto.py`).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import importlib
import importlib.util
import itertools
import pathlib
import re
import shlex
import sys

import pytest
from absl import app  # noqa: F401  # pylint: disable=unused-import  # Defines absl's own flags (--pdb, ...) that every command takes.
from absl import flags
from absl import logging  # noqa: F401  # pylint: disable=unused-import  # Defines --verbosity, --logtostderr, ...

from jaxemb import cli, config_fields, spec
from jaxemb import sweep
from jaxemb.errors import ConfigError
from jaxemb.evaluation import evaluators
from jaxemb.methods import base as methods
from tests.support import REPO, shared_path

DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
ENTRY_POINTS = ("train.py", "evaluate.py", "prepare.py", "sweep.py", "embed.py")
CLI = REPO / "jaxemb" / "cli.py"  # Defines --config, --verbose and --print_config for the entry points.
_FENCE = re.compile(r"^\s*```(\w*)")
_SHELL = ("bash", "sh", "shell")
_SEPARATORS = {"&&", "||", ";", "|"}
_PYTHON = ("python", "python3")
_PLACEHOLDER = "..."  # An elided part of a command: `python evaluate.py --config ... ...`.
# absl flags that app.run defines itself rather than by DEFINE_* calls at import.
_ABSL_RUN_FLAGS = {"help", "helpshort", "helpfull", "helpxml", "flagfile", "undefok"}
_CONFIG_FLAG = re.compile(r"--(?:no)?config\.(\w+(?:\.\w+)*)")  # --config.a.b=value: the field a.b.
_FILE_NAME = re.compile(r"\.(py|json|jsonl|md|txt|csv|npz|png)$")  # `train.py` names a file, not the field train.py.


@dataclasses.dataclass(frozen=True)
class Command:
  """A quoted command: where it is (`docs/training.md:12`, or `:4-6` over continued lines), its words after `python`."""

  where: str
  argv: tuple[str, ...]


def quoted_commands(text: str, name: str) -> list[Command]:
  """The python commands quoted in the markdown `text` of the file `name`."""
  blocks, prose = _shell_blocks_and_prose(text)
  commands = [command for block in blocks for command in _shell_commands(block, name)]
  return commands + [
    Command(f"{name}:{number}", argv)
    for number, span in _inline_code(prose)
    if (argv := _inline_argv(span, name, number)) is not None
  ]


def _shell_blocks_and_prose(text: str) -> tuple[list[list[tuple[int, str]]], list[tuple[int, str]]]:
  """The fenced shell blocks of markdown `text` and the lines outside any fenced block, as (line number, line)."""
  blocks, block, prose, fence = [], [], [], None
  for number, line in enumerate(text.splitlines(), 1):
    opening = _FENCE.match(line)
    if opening and fence is None:
      fence, block = opening.group(1), []
    elif opening:
      if fence in _SHELL:
        blocks.append(block)
      fence = None
    elif fence is not None:
      block.append((number, line))
    else:
      prose.append((number, line))
  return blocks, prose


def _inline_code(prose: list[tuple[int, str]]) -> list[tuple[int, str]]:
  """(line number, text) of each inline code span in the (line number, line) pairs of prose; a span may go on over
  a line break within its paragraph."""
  spans = []
  for _, group in itertools.groupby(prose, key=lambda pair: bool(pair[1].strip())):  # Paragraphs.
    group = list(group)
    paragraph = "\n".join(line for _, line in group)
    spans += [
      (group[0][0] + paragraph.count("\n", 0, span.start()), span.group(1).replace("\n", " "))
      for span in re.finditer(r"`([^`]+)`", paragraph)
    ]
  return spans


def mentioned_fields(text: str, name: str) -> list[tuple[str, str]]:
  """(where, field) of each config field the markdown `text` names, in a command or in prose: every `--config.a.b`
  in a shell block (its comments too) or inline code, and inline code that is a field path (`train.batch_size`,
  `config.eval.selection`, `data.format=nli`)."""
  blocks, prose = _shell_blocks_and_prose(text)
  found = [
    (f"{name}:{number}", field)
    for number, line in [*itertools.chain(*blocks), *_inline_code(prose)]
    for field in _CONFIG_FLAG.findall(line)
  ]
  for number, span in _inline_code(prose):
    path = re.fullmatch(r"(?:config\.)?([a-z_]+(?:\.\w+)+)(=\S*)?", span)
    if path and path.group(1).split(".")[0] in _config_groups() and not _FILE_NAME.search(path.group(1)):
      found.append((f"{name}:{number}", path.group(1)))
  return found


def _shell_commands(block: list[tuple[int, str]], name: str) -> list[Command]:
  """The python commands of a fenced shell block's (line number, line) pairs."""
  commands, logical, start = [], "", None
  for number, line in block:
    start = start or number
    if line.endswith("\\"):  # As bash reads it: the backslash and newline vanish, inside quotes too.
      logical += line[:-1]
      continue
    where = f"{name}:{start}" if start == number else f"{name}:{start}-{number}"  # The lines the command spans.
    words = _words(logical + line, where, comments=True)
    logical, start = "", None
    part = []
    for word in [*words, ";"]:
      if word not in _SEPARATORS:
        part.append(word)
        continue
      while part and re.match(r"[A-Za-z_]\w*=", part[0]):  # VAR=value python ...
        part.pop(0)
      if part and part[0] in _PYTHON and len(part) > 1:
        commands.append(Command(where, tuple(part[1:])))
      part = []
  return commands


def _inline_argv(span: str, name: str, number: int) -> tuple[str, ...] | None:
  """The words after `python` of an inline code span that quotes a command; None for any other span."""
  first = span.split(" ", 1)[0]
  is_entry_point = first in ENTRY_POINTS and " -" in span
  is_config = first.endswith(".py") and (REPO / "configs" / first).is_file() and " --config." in span
  if first not in _PYTHON and not is_entry_point and not is_config:
    return None
  words = _words(span, f"{name}:{number}")
  if first in _PYTHON:
    return tuple(words[1:])
  if is_entry_point:
    return tuple(words)
  config = f"configs/{first}"
  script = "train.py" if sweep.is_training_config(_config(config)) else "evaluate.py"
  return (script, "--config", config, *words[1:])


def _words(text: str, where: str, comments: bool = False) -> list[str]:
  """The words of a command line as the shell splits them."""
  try:
    return shlex.split(text, comments=comments)
  except ValueError as e:  # An unclosed quote.
    raise AssertionError(f"{where}: cannot read the command `{text}`: {e}") from None


def problems(command: Command) -> list[str]:
  """What `command` names that does not exist, each as `<file>:<line>: <the bad part>: <why>`."""
  argv = [word for word in command.argv if word != _PLACEHOLDER]
  if not argv:
    return []
  if argv[0] == "-m":
    module = argv[1] if len(argv) > 1 else ""
    try:
      spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # A missing parent package (`nopackage.module`), an empty name.
      spec = None
    if spec is None or spec.origin is None:
      return [f"{command.where}: python -m {module}: no such module"]
    program, args = pathlib.Path(spec.origin), argv[2:]
    if REPO not in program.parents:  # Another project's module (pytest): its flags are not ours to check.
      return []
  elif argv[0].startswith("-"):  # python -c ...
    return []
  else:
    program, args = REPO / argv[0], argv[1:]
    if not program.is_file():
      return [f"{command.where}: python {argv[0]}: no such file"]
  found = _argument_problems(program, args) + _method_field_problems(program, args)
  return [f"{command.where}: {problem}" for problem in found]


def _argument_problems(program: pathlib.Path, args: list[str]) -> list[str]:
  """Flags `program` does not define, a config file that is not there, config fields it does not have."""
  takes_config = program.parent == REPO and program.name in ENTRY_POINTS  # --config FILE, --config.a.b=value.
  found, config_file, fields = [], None, []
  words = iter(args)
  for word in words:
    match = re.fullmatch(r"--?([A-Za-z][\w.-]*)(=(.*))?", word, re.DOTALL)
    if not match:
      continue  # A positional argument or a flag's value.
    flag, name, value = word.split("=", 1)[0], match.group(1), match.group(3)
    if takes_config and name == "config":
      config_file = value if value is not None else next(words, None)
    elif takes_config and name.startswith(("config.", "noconfig.")):  # --noconfig.a.b sets a bool field to False.
      fields.append((flag, name.split(".", 1)[1], value))
    elif name.startswith("method.") and "method" in _defined_flags(program):
      continue  # A field of the method --method names: _method_field_problems.
    elif name not in _defined_flags(program) and name.removeprefix("no") not in _defined_flags(program):
      found.append(f"{flag}: {program.relative_to(REPO)} defines no such flag")
  if config_file is None:
    return found + [f"{flag}: no --config file to hold it" for flag, _, _ in fields]
  if not (REPO / config_file.split(":", 1)[0]).is_file():
    return found + [f"--config {config_file}: no such file"]
  try:
    config = _config(config_file)
  except Exception as e:  # pylint: disable=broad-except  # get_config refused its argument: the doc's to fix.
    return found + [f"--config {config_file}: {type(e).__name__}: {e}"]
  # --config.evals.<name>.type=<type> adds an evaluator, --config.method.name=<name> that method's fields, as the
  # commands do.
  if any(re.fullmatch(r"evals\.\w+\.type|method(\.source)?\.name", field) for _, field, _ in fields):
    config = copy.deepcopy(config)
    cli.complete(config, [f"--{cli.CONFIG}.{field}={value}" for _, field, value in fields if value is not None])
  found += [f"{flag}: {reason}" for flag, field, _ in fields if (reason := config_fields.unknown_field(config, field))]
  if "rows" in config:  # An experiment (sweep.py): its rows' base configs and the overrides applied to each.
    overrides = [value for _, field, value in fields if field == "overrides" and value is not None]
    found += _experiment_problems(config, overrides[-1] if overrides else "")
  return found


def _method_field_problems(program: pathlib.Path, args: list[str]) -> list[str]:
  """The --method.FIELD flags of a command taking --method NAME (jaxemb.export) that name no field of that method's
  block."""
  if "method" not in _defined_flags(program):
    return []
  given = [arg.split("=", 1)[0] for arg in args if arg.startswith("--method.")]
  spaced = (value for flag, value in zip(args, args[1:]) if flag == "--method")
  named = next((arg.split("=", 1)[1] for arg in args if arg.startswith("--method=")), next(spaced, None))
  if not given or named not in methods.names():
    return [f"{flag}: no --method naming a method" for flag in given]
  found = []
  for flag in given:
    value = methods.defaults(named)
    for part in flag.removeprefix("--method.").split("."):
      value = value.get(part) if isinstance(value, dict) else None
    if value is None:
      found.append(f"{flag}: method {named!r} has no such field")
  return found


def _experiment_problems(experiment, overrides: str) -> list[str]:
  """A row's base config that is not there, and the fields of `--config.overrides="a.b=1; ..."` a row's base config
  does not have."""
  found = []
  for row in experiment.rows:
    try:
      base = sweep.base_config(row.get("base", experiment.base))
    except ConfigError as e:
      found.append(f"--config {experiment.name!r}: {e}")
      continue
    for key in sweep.parse_overrides(overrides):
      reason = config_fields.unknown_field(base, key)
      if reason:
        found.append(f"--config.overrides: {key}: {reason}")
  return sorted(set(found))


@functools.cache
def _config(config_file: str):
  """The config a `--config FILE[:arg]` flag loads: the module's get_config(arg), or get_config()."""
  path, _, argument = config_file.partition(":")
  module = importlib.import_module(".".join(pathlib.Path(path).with_suffix("").parts))
  config = module.get_config(argument) if argument else module.get_config()
  cli.complete(config)
  return config


@functools.cache
def _every_config() -> tuple:
  """The config of every file under configs/ (get_config() at its defaults)."""
  paths = sorted(path for path in (REPO / "configs").rglob("*.py") if not path.name.startswith("_"))
  modules = [importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts)) for path in paths]
  configs = tuple(module.get_config() for module in modules if hasattr(module, "get_config"))
  for config in configs:
    cli.complete(config)
  return configs


@functools.cache
def _config_groups() -> frozenset[str]:
  """The top-level groups of fields of the configs (train, eval, data, model, method, ...)."""
  return frozenset(key for config in _every_config() for key, value in config.items() if hasattr(value, "items"))


@functools.cache
def _defined_flags(program: pathlib.Path) -> frozenset[str]:
  """The flags `program` takes: its argparse `add_argument("--x")` names, or for an absl command its DEFINE_* names,
  jaxemb/cli.py's and absl's own."""
  tree = ast.parse(program.read_text())
  calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
  argparse_flags = {
    arg.value.lstrip("-")
    for call in calls
    if _called(call) == "add_argument"
    for arg in call.args
    if isinstance(arg, ast.Constant) and str(arg.value).startswith("-")
  }
  if argparse_flags:
    return frozenset(argparse_flags | {"h", "help"})
  absl_flags = {
    call.args[0].value
    for call in calls
    if _called(call).startswith("DEFINE_") and call.args and isinstance(call.args[0], ast.Constant)
  }
  if program in (REPO / script for script in ENTRY_POINTS):
    absl_flags |= _defined_flags(CLI) | {"config"} | _ABSL_RUN_FLAGS
    for module, module_flags in flags.FLAGS.flags_by_module_dict().items():
      if module.startswith("absl."):
        absl_flags |= {name for flag in module_flags for name in (flag.name, flag.short_name) if name}
  return frozenset(absl_flags)


def _called(call: ast.Call) -> str:
  """The name of the function a call calls: `flags.DEFINE_bool(...)` -> "DEFINE_bool"."""
  return getattr(call.func, "attr", getattr(call.func, "id", ""))


@functools.cache
def _all_commands() -> list[Command]:
  return [command for path in DOCS for command in quoted_commands(path.read_text(), str(path.relative_to(REPO)))]


def test_docs_quote_commands_of_every_kind():
  commands = _all_commands()
  assert len(commands) > 60, "the docs quote more commands than were found: the parser misses some"
  assert {command.argv[0] for command in commands} >= {*ENTRY_POINTS, "-m"}
  assert any("--config.overrides" in " ".join(command.argv) for command in commands)


def test_every_quoted_command_names_an_entry_point_config_and_flags_that_exist():
  found = [problem for command in _all_commands() for problem in problems(command)]
  assert not found, "\n".join(found)


def test_every_quoted_command_builds_the_spec_its_command_runs(monkeypatch):
  """Each quoted command's config, its --config.* overrides applied as the command applies them, is one its spec
  accepts (what --print_config checks): a field the named method does not take, a value of a field's wrong kind
  fail here. (docs/experiments.md's Ditto Table 5 command stopped with 'method ditto takes no template'.)"""
  problems, checked = [], 0
  for command in _all_commands():
    argv = _config_words(command.argv)
    if command.argv[0] not in ENTRY_POINTS or not argv:
      continue
    checked += 1
    monkeypatch.setattr(sys, "argv", [command.argv[0], *argv])  # config_flags reads the overrides from sys.argv.
    values = flags.FlagValues()
    config = cli.define_config("the command's config", values)
    try:
      values(sys.argv)
      typed = spec.spec_class(config.value)
      if typed is not None:
        typed.from_config(config.value)
    except Exception as e:  # pylint: disable=broad-except  # Each problem named, all at once.
      problems.append(f"{command.where}: {' '.join(command.argv)}: {type(e).__name__}: {e}")
  assert not problems, "\n".join(problems)
  assert checked > 100  # Every entry point's commands in README and docs/.


def _config_words(argv: tuple[str, ...]) -> list[str]:
  """The --config FILE and --config.* words of a command, those holding an elided part (`...`, `<run>`) left out;
  [] for a command without --config."""
  words = []
  for i, word in enumerate(argv):
    if _PLACEHOLDER in word or "<" in word:
      continue
    if word == "--config" and i + 1 < len(argv):
      words += [word, argv[i + 1]]
    elif word.startswith(("--config=", "--config.", "--noconfig.")):
      words.append(word)
  return words if any(word == "--config" or word.startswith("--config=") for word in words) else []


def test_every_config_field_the_docs_name_is_a_field_of_a_config():
  fields = [mentioned for path in DOCS for mentioned in mentioned_fields(path.read_text(), str(path.relative_to(REPO)))]
  assert len(fields) > 100 and {"model.path", "train.batch_size", "method.template"} <= {field for _, field in fields}
  found = [
    f"{where}: {field}: no config has this field"
    for where, field in fields
    if not _an_added_evaluators_field(field)
    and not _a_methods_field(field)
    and all(config_fields.unknown_field(config, field) for config in _every_config())
  ]
  assert not found, "\n".join(found)


def _an_added_evaluators_field(field: str) -> bool:
  """Whether `field` is evals.<name>.<field> of an evaluator the command line adds (`--config.evals.<name>.type=`)."""
  match = re.fullmatch(r"evals\.\w+\.(\w+)", field)
  fields = itertools.chain(*map(evaluators.type_defaults, evaluators.types()))
  return bool(match) and match.group(1) in {"type", "every", *fields}


def _a_methods_field(field: str) -> bool:
  """Whether `field` is method.<field> of some method's block, or method.source.<field> (`--config.method.name=`
  and `--config.method.source.name=` complete their methods' fields)."""
  match = re.fullmatch(r"method\.(source\.)?(\w+)", field)
  return bool(match) and any(match.group(2) in methods.defaults(name) for name in methods.names())


def test_a_config_field_named_alone_is_found_and_a_file_name_is_not():
  text = (
    "`--config.method.head=pooler`, `train.batch_size`, `config.eval.selection`, `data.format=nli`, `train.py`,"
    " `eval_method.json`, `jaxemb.encode.Method`\n```bash\npython x.py  # or --config.train.mesh_fsdp=2\n```\n"
    "```\n$ python train.py --config.train.batchsize=8\n```"
  )
  assert mentioned_fields(text, "doc.md") == [
    ("doc.md:3", "train.mesh_fsdp"),
    ("doc.md:1", "method.head"),
    ("doc.md:1", "train.batch_size"),
    ("doc.md:1", "eval.selection"),
    ("doc.md:1", "data.format"),
  ]


def _problems_in(text: str) -> list[str]:
  return [problem for command in quoted_commands(text, "doc.md") for problem in problems(command)]


@pytest.mark.parametrize(
  "doc, expected",
  [
    (
      "```bash\npython train.py --config configs/promptbert.py --config.train.batchsize=8\n```",
      "doc.md:2: --config.train.batchsize: no field 'batchsize' in config.train (did you mean 'batch_size'?)",
    ),
    (
      "x\n```bash\n# a comment\npython evaluate.py --config configs/eval_prompt.py \\\n"
      "    --config.method.nam=prompt   # a comment\n```",
      "doc.md:4-5: --config.method.nam: no field 'nam'",
    ),
    (
      "Run `python sweep.py --config configs/experiments/seeds.py:promptbert --shards=1/4`.",
      "doc.md:1: --shards: sweep.py defines no such flag",
    ),
    ("Then `eval_ditto.py --config.method.ditto_layr=1`.", "doc.md:1: --config.method.ditto_layr: no field"),
    (
      "```bash\npython sweep.py --config configs/experiments/seeds.py:promptbert \\\n"
      "    --config.overrides=\"train.num_steps=3; \\\n    eval.senteval_dirr='x'\"\n```",
      "doc.md:2-4: --config.overrides: eval.senteval_dirr: no field 'senteval_dirr'",
    ),
    (
      "```bash\nJAXEMB_MODELS=m python train.py --config configs/promptbrt.py\n```",
      "doc.md:2: --config configs/promptbrt.py: no such file",
    ),
    (
      "`python sweep.py --config configs/experiments/seeds.py:promptbrt`",
      "doc.md:1: --config 'promptbrt over seeds': row base 'promptbrt': there is no configs/promptbrt.py (did you "
      "mean 'promptbert'?)",
    ),
    (
      "`python sweep.py --config configs/experiments/promptbert_table3.py:uncasd`",
      "doc.md:1: --config configs/experiments/promptbert_table3.py:uncasd: ValueError: ",
    ),
    ("`python bench/scaling.py --config simcse --batchsize 8`", "doc.md:1: --batchsize: bench/scaling.py defines no"),
    (
      "```bash\npip install x && python trian.py --config configs/promptbert.py\n```",
      "doc.md:2: python trian.py: no such file",
    ),
    ("`python -m jaxemb.exprt --model m --out o`", "doc.md:1: python -m jaxemb.exprt: no such module"),
    ("`python -m nopackage.export --model m`", "doc.md:1: python -m nopackage.export: no such module"),
    ("`python -m jaxemb.export --modle m --out o`", "doc.md:1: --modle: jaxemb/export.py defines no such flag"),
    ("`python train.py --config.train.seed=1`", "doc.md:1: --config.train.seed: no --config file to hold it"),
    (
      "`python -m jaxemb.export --model m --method last_avg --method.template=x --out o`",
      "doc.md:1: --method.template: method 'last_avg' has no such field",
    ),
    ("`python -m jaxemb.export --model m --method.head=8 --out o`", "doc.md:1: --method.head: no --method naming"),
    (
      "a\n\nb `python train.py\n--config configs/promptbert.py --config.trian.seed=1` c",  # A span over a line break.
      "doc.md:3: --config.trian.seed: no field 'trian' in config (did you mean 'train'?)",
    ),
  ],
)
def test_a_command_naming_what_does_not_exist_fails_naming_the_line_and_the_part(doc, expected):
  found = _problems_in(doc)
  assert len(found) == 1 and found[0].startswith(expected), found


def test_commands_naming_what_exists_pass():
  assert not _problems_in(
    "```bash\npython train.py --config configs/promptbert.py --config.train.batch_size=8 --resume_changed \\\n"
    "    --noverbose --verbosity=1 --config.model.path=... ...   # comment --config.zz\n"
    "python -m jaxemb.export --model m --out o --method prompt --method.denoise=position_offset --method.head pooler\n"
    "python -m jaxemb.export --model m --out o --method=ditto --method.layer=1\n"
    'python -m pytest -q -m "not slow"\n```\n'
    "```\n$ python train.py --config configs/promptbert.py --config.train.batchsize=8\n```\n"  # Not a shell block.
    "`sweep.py --config configs/experiments/promptbert_table3.py:cased --table_only`, `cotroberta.py`, "
    "`eval_ditto.py --config.method.variant=last`"
  )


def test_readmes_python_api_runs_as_written_and_prints_its_similarities(trained_run):
  """README's Python block, run where README's commands run (a clone with ../shared beside it), its run directory the
  quickstart's (a tiny trained run here): every line works offline, and the similarities its comment shows are what
  it computes."""
  block = re.search(r"## Python API\n\n```python\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
  shared = shared_path()
  code = block.replace('"../shared/', f'"{shared}/').replace('"runs/quickstart"', f'"{trained_run}"')
  namespace = {}
  exec(compile(code, "README.md", "exec"), namespace)  # pylint: disable=exec-used
  shown = re.search(r"similarity\(vectors\[:1\], vectors\)  # (\[\[.*?\]\])", block).group(1)
  computed = namespace["similarity"](namespace["vectors"][:1], namespace["vectors"])
  assert [[round(float(x), 3) for x in computed[0]]] == ast.literal_eval(shown)
  assert namespace["prompt"].encode(["A man is playing a guitar."]).shape == (1, 384)
  assert namespace["trained"].encode(["A man is playing a guitar."]).ndim == 2
