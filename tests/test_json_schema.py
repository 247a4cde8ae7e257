"""JSON Schema -> GBNF (schema/json_schema.c) checked against references nobody here wrote.

For every schema of the corpus in tests/data/json_schemas/ (shapes from JSON Schema's own test
suite, OpenAI strict-mode examples, Home Assistant-like actions, recursive trees, formats,
patterns), kiri's GBNF must be accepted by llama.cpp's grammar parser (llama-cpp-python), and the
text generated under it, by llama.cpp and by `kiri run --grammar`, on models/stories260K.gguf over
several seeds and temperatures, must validate with the `jsonschema` package (formats checked:
jsonschema's checkers, plus Python's datetime for date-time and time, which jsonschema leaves
unchecked without extra packages).

The 260K-parameter model often writes a string (or a run of digits) that it never closes; a
generation cut by the token limit proves nothing either way, so it is counted, and the test
requires that most runs finish. Every finished output must validate, and for each schema at least
one must be more than {} / [] / "".

Schemas kiri cannot honour, and hostile ones, must be refused with the right status, field (JSON
pointer) and keyword, in bounded time.

Binaries: $KIRI_BUILD (else <repo>/build)/json_schema_gbnf and kiri.
Run: ~/.cache/kiri/venv/bin/python -m pytest -q tests/test_json_schema.py
"""
import concurrent.futures
import datetime
import json
import os
import re
import subprocess
import time
from pathlib import Path

import jsonschema
import llama_cpp
import pytest

REPO = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("KIRI_BUILD", REPO / "build"))
TOOL = BUILD / "json_schema_gbnf"
KIRI = Path(os.environ["KIRI_BIN"]) if os.environ.get("KIRI_BIN") else BUILD / "kiri"
MODEL = REPO / "models" / "stories260K.gguf"
CORPUS = sorted((REPO / "tests" / "data" / "json_schemas").glob("*.json"))
PROMPT = "Once upon a time"
LLAMA_RUNS = ((1, 0.0), (2, 0.8), (3, 1.2))
KIRI_RUNS = ((11, 0.0), (12, 0.8), (13, 1.3))
MAX_TOKENS = 300


def need(path: Path) -> Path:
    assert path.exists(), "%s is not built (cmake --build build --target %s)" % (path, path.name)
    return path


def compile_schema(text: bytes, *args):
    """(returncode, gbnf, stderr) of the test tool on schema text."""
    p = subprocess.run([str(need(TOOL)), "-", *args], input=text, capture_output=True, timeout=30)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def gbnf_of(path: Path) -> str:
    rc, out, err = compile_schema(path.read_bytes())
    assert rc == 0, "%s: %s" % (path.name, err)
    return out


RFC3339_TIME = re.compile(r"^\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def format_checker(validator_cls):
    checker = jsonschema.FormatChecker(list(validator_cls.FORMAT_CHECKER.checkers))

    @checker.checks("date-time", raises=ValueError)
    def date_time(s):
        if not isinstance(s, str):
            return True
        d, sep, t = s.partition("T")
        datetime.date.fromisoformat(d)
        return sep == "T" and date_time_part(t)

    @checker.checks("time", raises=ValueError)
    def time_(s):
        return not isinstance(s, str) or date_time_part(s)

    def date_time_part(t):
        if not RFC3339_TIME.match(t):
            return False
        datetime.time.fromisoformat(t)
        return True

    return checker


def validator(schema):
    cls = jsonschema.validators.validator_for(schema) if isinstance(schema, dict) else jsonschema.Draft202012Validator
    cls.check_schema(schema)
    return cls(schema, format_checker=format_checker(cls))


def trivial(value) -> bool:
    return value in ({}, [], "")


class Tally:
    """Outputs of one engine over the corpus."""

    def __init__(self):
        self.runs = self.finished = 0
        self.invalid = []
        self.content = {}

    def add(self, name, schema, text, truncated):
        self.runs += 1
        try:
            value = json.loads(text)
        except ValueError as e:
            if not truncated:
                self.invalid.append("%s: not JSON (%s): %r" % (name, e, text[:200]))
            return
        self.finished += 1
        errors = list(validator(schema).iter_errors(value))
        if errors:
            self.invalid.append("%s: %s: %r" % (name, errors[0].message, text[:200]))
        self.content[name] = self.content.get(name, False) or not trivial(value)

    def check(self):
        assert not self.invalid, "\n".join(self.invalid)
        assert self.finished >= 0.75 * self.runs, "only %d of %d generations finished" % (self.finished, self.runs)
        empty = [n for n, c in self.content.items() if not c]
        assert not empty, "only {} / [] / \"\" generated for: %s" % empty


def test_corpus_size():
    assert len(CORPUS) >= 50


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_llama_cpp_parses_the_grammar(path):
    validator(json.loads(path.read_text()))  # the corpus schema itself is valid
    llama_cpp.LlamaGrammar.from_string(gbnf_of(path), verbose=False)


@pytest.fixture(scope="module")
def llm():
    return llama_cpp.Llama(model_path=str(MODEL), verbose=False, n_ctx=1024, seed=1)


def test_llama_cpp_outputs_validate(llm):
    tally = Tally()
    for path in CORPUS:
        schema = json.loads(path.read_text())
        grammar = llama_cpp.LlamaGrammar.from_string(gbnf_of(path), verbose=False)
        for seed, temp in LLAMA_RUNS:
            out = llm.create_completion(PROMPT, grammar=grammar, max_tokens=MAX_TOKENS, temperature=temp, seed=seed)
            choice = out["choices"][0]
            tally.add(path.stem, schema, choice["text"], choice["finish_reason"] == "length")
    tally.check()


def kiri_generate(gbnf_path: Path, seed: int, temp: float):
    p = subprocess.run([str(need(KIRI)), "run", "-m", str(MODEL), "--grammar", str(gbnf_path), "--seed", str(seed),
                        "--temp", str(temp), "-n", str(MAX_TOKENS), "-p", PROMPT],
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    m = re.search(r"generated (\d+) tokens", p.stderr.decode())
    assert m, p.stderr.decode()
    return p.stdout.decode(), int(m.group(1)) >= MAX_TOKENS


def test_kiri_run_outputs_validate(tmp_path):
    jobs = []
    for path in CORPUS:
        g = tmp_path / (path.stem + ".gbnf")
        g.write_text(gbnf_of(path))
        jobs += [(path, g, seed, temp) for seed, temp in KIRI_RUNS]
    tally = Tally()
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = pool.map(lambda j: kiri_generate(j[1], j[2], j[3]), jobs)
        for (path, _, _, _), (text, truncated) in zip(jobs, results):
            tally.add(path.stem, json.loads(path.read_text()), text.strip(), truncated)
    tally.check()


def test_prefixed_rules_join_one_grammar():
    """Two schemas compiled with their own root names and prefixes join into one grammar."""
    a = REPO / "tests/data/json_schemas/home_assistant_action.json"
    b = REPO / "tests/data/json_schemas/recursive_tree.json"
    rc, ga, err = compile_schema(a.read_bytes(), "--root", "tool-a", "--prefix", "a-")
    assert rc == 0, err
    rc, gb, err = compile_schema(b.read_bytes(), "--root", "tool-b", "--prefix", "b-")
    assert rc == 0, err
    llama_cpp.LlamaGrammar.from_string('root ::= tool-a | tool-b\n' + ga + gb, verbose=False)


def deep(n):
    return '{"type":"array","items":' * n + "true" + "}" * n


def enum_of(n):
    return json.dumps({"enum": list(range(n))})


# (schema text, status, field, a word the message must hold)
REFUSED = [
    ('{"type": "string"', "E_INVALID_ARG", "json_schema", "not JSON"),
    ("", "E_INVALID_ARG", "json_schema", "not JSON"),
    ('{"type": "string", "type": 2}', "E_INVALID_ARG", "#", "type"),  # duplicate keys: the last wins
    ("\ufeff{}", "E_INVALID_ARG", "json_schema", "not JSON"),
    ("[]", "E_INVALID_ARG", "#", "schema"),
    ('{"type": "strng"}', "E_INVALID_ARG", "#", "type"),
    ('{"type": 3}', "E_INVALID_ARG", "#", "type"),
    ('{"properties": []}', "E_INVALID_ARG", "#", "properties"),
    ('{"required": "a"}', "E_INVALID_ARG", "#", "required"),
    ('{"minLength": -1}', "E_INVALID_ARG", "#", "minLength"),
    ('{"maxItems": 1.5}', "E_INVALID_ARG", "#", "maxItems"),
    ('{"pattern": 5}', "E_INVALID_ARG", "#", "pattern"),
    ('{"anyOf": []}', "E_INVALID_ARG", "#", "anyOf"),
    ('{"properties": {"a": {"items": "x"}}}', "E_INVALID_ARG", "#/properties/a", "items"),
    ('{"type": "array", "uniqueItems": true}', "E_UNSUPPORTED", "#", "uniqueItems"),
    ('{"type": "number", "multipleOf": 0.5}', "E_UNSUPPORTED", "#", "multipleOf"),
    ('{"not": {"type": "null"}}', "E_UNSUPPORTED", "#", "not"),
    ('{"if": {}, "then": {}}', "E_UNSUPPORTED", "#", "if"),
    ('{"type": "object", "patternProperties": {"^a": {}}}', "E_UNSUPPORTED", "#", "patternProperties"),
    ('{"type": "object", "propertyNames": {"maxLength": 3}}', "E_UNSUPPORTED", "#", "propertyNames"),
    ('{"type": "object", "minProperties": 2}', "E_UNSUPPORTED", "#", "minProperties"),
    ('{"type": "object", "dependentRequired": {"a": ["b"]}}', "E_UNSUPPORTED", "#", "dependentRequired"),
    ('{"type": "array", "contains": {"type": "null"}}', "E_UNSUPPORTED", "#", "contains"),
    ('{"properties": {"x": {"unevaluatedProperties": false}}}', "E_UNSUPPORTED", "#/properties/x", "unevaluated"),
    ('{"type": "number", "minimum": 0.2, "maximum": 0.8}', "E_UNSUPPORTED", "#", "minimum"),
    ('{"type": "string", "format": "ipv6"}', "E_UNSUPPORTED", "#", "format"),
    ('{"type": "string", "pattern": "(a)\\\\1"}', "E_UNSUPPORTED", "#", "backreference"),
    ('{"type": "string", "pattern": "a(?=b)"}', "E_UNSUPPORTED", "#", "lookahead"),
    ('{"type": "string", "pattern": "a(?!b)"}', "E_UNSUPPORTED", "#", "lookahead"),
    ('{"type": "string", "pattern": "(?<=a)b"}', "E_UNSUPPORTED", "#", "lookbehind"),
    ('{"type": "string", "pattern": "\\\\bword"}', "E_UNSUPPORTED", "#", "word boundary"),
    ('{"type": "string", "pattern": "\\\\p{L}"}', "E_UNSUPPORTED", "#", "property"),
    ('{"type": "string", "pattern": "a{1,9999}"}', "E_UNSUPPORTED", "#", "quantifier"),
    ('{"type": "string", "pattern": "(ab"}', "E_INVALID_ARG", "#", "parenthesis"),
    ('{"type": "string", "pattern": "a(^b)"}', "E_UNSUPPORTED", "#", "^"),
    ('{"type": "string", "pattern": "[^\\\\s\\\\S]"}', "E_UNSUPPORTED", "#", "class"),
    ('{"$ref": "other.json#/a"}', "E_UNSUPPORTED", "#", "$ref"),
    ('{"$ref": "#anchor"}', "E_UNSUPPORTED", "#", "$ref"),
    ('{"$ref": "#/$defs/nope"}', "E_INVALID_ARG", "#", "$ref"),
    ('{"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}', "E_UNSUPPORTED", "#/$defs/a", "recursion"),
    ('{"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}',
     "E_UNSUPPORTED", None, "recursion"),
    ('{"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},'
     ' "$ref": "#/$defs/n"}', "E_UNSUPPORTED", "#/$defs/n", "recursion"),
    ('{"$defs": {"l": {"type": "array", "items": {"$ref": "#/$defs/l"}, "minItems": 1}}, "$ref": "#/$defs/l"}',
     "E_UNSUPPORTED", "#/$defs/l", "recursion"),
    ('{"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}}', "E_UNSUPPORTED", "#/properties/a",
     "recursion"),
    ('{"allOf": [{"$ref": "#"}]}', "E_UNSUPPORTED", "#", "allOf"),
    ('{"allOf": [{"type": "string"}, {"type": "integer"}]}', "E_UNSUPPORTED", "#", "allOf"),
    ('{"allOf": [{"pattern": "a"}, {"pattern": "b"}]}', "E_UNSUPPORTED", "#", "pattern"),
    ('{"oneOf": [{"type": "integer"}, {"type": "number"}]}', "E_UNSUPPORTED", "#", "oneOf"),
    ('{"oneOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}', "E_UNSUPPORTED", "#", "oneOf"),
    ('{"enum": []}', "E_UNSUPPORTED", "#", "enum"),
    ('{"type": "string", "enum": [1, 2]}', "E_UNSUPPORTED", "#", "enum"),
    ('{"enum": ["a"], "minLength": 3}', "E_UNSUPPORTED", "#", "minLength"),
    ('{"type": "object", "properties": {"a": false}, "required": ["a"]}', "E_UNSUPPORTED", "#/properties/a", "required"),
    ('{"type": "string", "minLength": 5, "maxLength": 2}', "E_UNSUPPORTED", "#", "minLength"),
    ('{"type": "array", "minItems": 3, "maxItems": 1}', "E_UNSUPPORTED", "#", "minItems"),
    ('{"type": "array", "minItems": 100000}', "E_UNSUPPORTED", "#", "minItems"),
    ("false", "E_UNSUPPORTED", "#", "false"),
    ('{"anyOf": [false, false]}', "E_UNSUPPORTED", "#", "anyOf"),
    (deep(1000), "E_UNSUPPORTED", None, "deeper"),
    (deep(5000), "E_INVALID_ARG", "json_schema", "not JSON"),
    (deep(10000), "E_INVALID_ARG", "json_schema", "not JSON"),
    (enum_of(100000), "E_UNSUPPORTED", "#", "enum"),
    (json.dumps({"type": "object", "properties": {"p%d" % i: {} for i in range(2000)}}), "E_UNSUPPORTED", "#",
     "properties"),
    (json.dumps({"type": "string", "description": "x" * (2 << 20)}), "E_INVALID_ARG", "json_schema", "larger"),
]


@pytest.mark.parametrize("schema,status,field,word", REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_refused_naming_field_and_keyword(schema, status, field, word):
    t0 = time.monotonic()
    rc, out, err = compile_schema(schema.encode())
    assert time.monotonic() - t0 < 10
    assert rc == 1 and out == "", (rc, out[:200], err)
    m = re.match(r"(E_\w+) (\S*): (.*)", err)
    assert m, err
    assert m.group(1) == status, err
    if field is not None:
        assert m.group(2) == field, err
    assert word in m.group(3), err


def test_exponential_refs_stay_bounded():
    """A chain of definitions, each naming the next twice, compiles to one rule per definition."""
    defs = {"d%d" % i: {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/d%d" % (i + 1)}] * 2}} for i in range(30)}
    defs["d30"] = {"type": "null"}
    t0 = time.monotonic()
    rc, out, err = compile_schema(json.dumps({"$defs": defs, "$ref": "#/$defs/d0"}).encode())
    assert rc == 0, err
    assert time.monotonic() - t0 < 10
    assert len(out) < 64 * 1024
    llama_cpp.LlamaGrammar.from_string(out, verbose=False)


# Patterns beyond the corpus, each generated under llama.cpp and checked by jsonschema (Python's re,
# which lacks ECMA's (?<name>...) groups; the compiler takes them). Bounded, so generations finish.
PATTERNS = [
    r"^[a-c]{2,4}$", r"^\d{1,3}(,\d{3}){0,2}$", r"^[^a-z\s]{1,6}$", r"^(?:\+?1[-. ]?)?\d{3}[-. ]\d{4}$",
    r"^\S{1,8}$", r"^\D{1,5}$", r"^\W{1,3}$", r"^[\w.-]{1,10}@[a-z]{2,5}\.(com|org)$", r"^.{0,6}$",
    r'^["\\]{1,4}$', r"^\t?\n?x$", r"^\x41\u0042[\x43-\x45]$", r"^ab$|^c$", r"^(a|bc|def){1,3}?$",
    r"^[-+]?[0-9]{0,3}\.?[0-9]{1,3}$", r"^[A-Z][a-z]*( [A-Z][a-z]*){0,2}$",
    r"^[\]\[]{2}$", r"^v\d{1,2}\.\d{1,2}\.\d{1,2}(-[a-z]{1,4})?$", r"^#[0-9a-fA-F]{6}$", r"^x{0}y$", r"^[.]{2}[*]$",
    r"^\.\*\+\?\(\)\{\}\|\^\$\/$", r"^[é-ë]+$", r"^😀{1,2}$", r"^[a-z]{3}$|^[0-9]{2}$",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_outputs_match(llm, pattern):
    schema = {"type": "string", "pattern": pattern}
    rc, gbnf, err = compile_schema(json.dumps(schema).encode())
    assert rc == 0, err
    grammar = llama_cpp.LlamaGrammar.from_string(gbnf, verbose=False)
    finished = 0
    for seed, temp in LLAMA_RUNS:
        out = llm.create_completion(PROMPT, grammar=grammar, max_tokens=120, temperature=temp, seed=seed)
        choice = out["choices"][0]
        if choice["finish_reason"] == "length":
            continue
        finished += 1
        value = json.loads(choice["text"])
        assert re.search(pattern, value), (pattern, choice["text"])
        validator(schema).validate(value)
    assert finished, "no generation finished for %r" % pattern
