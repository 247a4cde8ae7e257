"""`kiri run` and `kiri chat` through the model's own chat template, on the real
SmolLM2-135M-Instruct (Q4_1, with a ChatML-style template in its GGUF file).

References nobody here wrote: the prompt text is jinja2's rendering of the template read from the
file with gguf-py, its token ids are llama.cpp's (llama-cpp-python) tokenization of that text, and
the answers are compared with llama.cpp's greedy decoding of the same tokens. `kiri chat` is driven
through a pseudo-terminal (pty), as a person at a terminal would use it, and through a pipe.
"""
import json
import os
import pty
import re
import select
import signal
import subprocess
import time

import gguf
import jinja2.sandbox
import jsonschema
import numpy as np
from jinja2.ext import loopcontrols
import llama_cpp
import pytest

from conftest import MODEL, kiri_binary

KIRI = str(kiri_binary())
QUESTION = "What is the capital of France?"       # the example
PARIS_QUESTION = "Name the capital of France."    # one this small model answers with Paris
FOLLOW_UP = "And of Italy?"                       # needs the first turn to make sense
SPEED = re.compile(r"(\d+) tokens, ([\d.]+) tok/s, first token ([\d.]+) s \(prompt (\d+) tokens, (\d+) cached\)")
RUN_STATS = re.compile(r"prompt (\d+) tokens in")


def gguf_str(reader, key):
    f = reader.fields[key]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


class Reference:
    """The file's template rendered by jinja2, tokenized and decoded by llama.cpp."""

    def __init__(self, path):
        r = gguf.GGUFReader(str(path))
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                           extensions=[loopcontrols])
        self.template = env.from_string(gguf_str(r, "tokenizer.chat_template"))
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=1024, n_threads=2, verbose=False)
        self.bos = self.llm.detokenize([self.llm.token_bos()], special=True).decode()
        self.eos = self.llm.detokenize([self.llm.token_eos()], special=True).decode()

    def render(self, messages):
        return self.template.render(messages=messages, add_generation_prompt=True,
                                    bos_token=self.bos, eos_token=self.eos)

    def tokens(self, messages):
        # add_bos=True asks for the BOS token only where the file's metadata wants one, as kiri does.
        return self.llm.tokenize(self.render(messages).encode(), add_bos=True, special=True)

    def ranks(self, tokens, continuation):
        """The rank of each token of `continuation` in llama.cpp's next-token logits after
        `tokens` and the continuation's earlier tokens (0: its greedy choice)."""
        self.llm.reset()
        self.llm.eval(tokens)
        out = []
        for t in continuation:
            # The last evaluated token's logits (without logits_all, Llama.scores is not kept).
            logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))
            out.append(int((logits > logits[t]).sum()))
            self.llm.eval([t])
        return out

    def greedy(self, tokens, n):
        self.llm.reset()
        out = self.llm.create_completion(tokens, max_tokens=n, temperature=0, top_k=1)
        return out["choices"][0]["text"]


@pytest.fixture(scope="module")
def ref(smollm2_instruct):
    return Reference(smollm2_instruct)


def run(*args, timeout=120, **kw):
    return subprocess.run([KIRI, *args], capture_output=True, text=True, timeout=timeout, **kw)


def user(text):
    return {"role": "user", "content": text}


def words(text, n):
    return text.split()[:n]


# ---- kiri run --------------------------------------------------------------------------------------

def test_run_renders_prompt_with_the_files_template(smollm2_instruct, ref):
    r = run("run", "-m", str(smollm2_instruct), "-p", QUESTION, "--show-prompt")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ref.render([user(QUESTION)])
    system = "You answer in one short sentence."
    r = run("run", "-m", str(smollm2_instruct), "-p", QUESTION, "--system", system, "--show-prompt")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ref.render([{"role": "system", "content": system}, user(QUESTION)])


def test_run_answers_through_the_template(smollm2_instruct, ref):
    tokens = ref.tokens([user(QUESTION)])
    r = run("run", "-m", str(smollm2_instruct), "-p", QUESTION, "--temp", "0", "-n", "16")
    assert r.returncode == 0, r.stderr
    assert int(RUN_STATS.search(r.stderr).group(1)) == len(tokens)
    assert r.stdout.strip(), "the instruct model must answer once the prompt goes through its template"
    # On a quantized file two correct runtimes part at near-ties, so the answer is held to being
    # one llama.cpp finds likely: its first token is llama.cpp's greedy one and each of its first
    # six tokens is among llama.cpp's top three at its place.
    answer = ref.llm.tokenize(r.stdout.encode(), add_bos=False, special=False)[:6]
    ranks = ref.ranks(tokens, answer)
    assert ranks[0] == 0 and max(ranks) < 3, (r.stdout, ref.greedy(tokens, 16), ranks)


def test_run_answer_mentions_paris(smollm2_instruct, ref):
    reference = ref.greedy(ref.tokens([user(PARIS_QUESTION)]), 24)
    assert "Paris" in reference   # the model really does say it
    r = run("run", "-m", str(smollm2_instruct), "-p", PARIS_QUESTION, "--temp", "0", "-n", "24")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_raw_sends_the_prompt_as_it_is(smollm2_instruct, ref):
    raw = ref.llm.tokenize(QUESTION.encode(), add_bos=True, special=False)
    r = run("run", "-m", str(smollm2_instruct), "-p", QUESTION, "--raw", "--temp", "0", "-n", "16")
    assert r.returncode == 0, r.stderr
    assert int(RUN_STATS.search(r.stderr).group(1)) == len(raw)
    assert r.stdout.strip() == ref.greedy(raw, 16).strip()
    r = run("run", "-m", str(smollm2_instruct), "-p", QUESTION, "--raw", "--show-prompt")
    assert r.stdout == QUESTION


def test_model_without_template_runs_as_before():
    plain = run("run", "-m", str(MODEL), "-p", "Once upon a time", "--temp", "0", "-n", "24")
    raw = run("run", "-m", str(MODEL), "-p", "Once upon a time", "--temp", "0", "-n", "24", "--raw")
    assert plain.returncode == 0 and raw.returncode == 0, plain.stderr + raw.stderr
    assert plain.stdout == raw.stdout and plain.stdout.strip()
    assert run("run", "-m", str(MODEL), "-p", "Once upon", "--show-prompt").stdout == "Once upon"


# ---- kiri chat through a pseudo-terminal -------------------------------------------------------------

class Terminal:
    """kiri chat on a pseudo-terminal: what it writes, read as it comes."""

    def __init__(self, args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(KIRI, [KIRI, *args])
        self.out = b""

    def read_until(self, pattern, timeout=60.0, start=0):
        if isinstance(pattern, re.Pattern):
            pattern = pattern.pattern
        pattern = re.compile(pattern.encode())
        end = time.monotonic() + timeout
        while True:
            m = pattern.search(self.out, start)
            if m:
                return m
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError("no %r within %.0f s; the terminal shows:\n%s"
                                     % (pattern.pattern, timeout, self.text()))
            if select.select([self.fd], [], [], min(left, 0.2))[0]:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    raise AssertionError("kiri chat ended; the terminal shows:\n" + self.text())
                self.out += data

    def send(self, text):
        os.write(self.fd, text.encode())

    def text(self):
        return self.out.decode(errors="replace")

    def turn(self, message):
        """Sends a message; returns the answer as printed and the speed line's numbers."""
        start = len(self.out)
        self.send(message)
        stats = self.read_until(SPEED, start=start)
        self.read_until(r">>> ", start=stats.end())
        shown = self.out[start:stats.start()].decode(errors="replace")
        return shown, [float(x) for x in stats.groups()]

    def wait(self, timeout=30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            try:
                if select.select([self.fd], [], [], 0.2)[0]:
                    self.out += os.read(self.fd, 65536)
            except OSError:
                time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError("kiri chat did not exit; the terminal shows:\n" + self.text())


def answer_text(shown, message):
    """The answer in what the terminal showed after a one-line message: the echo is the first
    line, the answer is what follows, the terminal writing each newline as CR LF."""
    body = shown.replace("\r\n", "\n").replace("\x1b[2m", "")
    assert body.startswith(message), body
    answer = body[len(message):]
    return answer[:-1] if answer.endswith("\n") else answer


def test_chat_on_a_terminal(smollm2_instruct, ref):
    t = Terminal(["chat", "-m", str(smollm2_instruct), "--temp", "0", "-n", "300", "-c", "1024"])
    t.read_until(r">>> ")

    # Turn 1, then a follow-up that only makes sense with the history.
    shown, stats1 = t.turn(PARIS_QUESTION + "\n")
    first = answer_text(shown, PARIS_QUESTION + "\n").strip("\n")
    assert "Paris" in first
    assert int(stats1[3]) == len(ref.tokens([user(PARIS_QUESTION)]))
    assert stats1[0] > 0 and stats1[1] > 0 and stats1[2] > 0
    assert "\x1b[2m" in t.text()   # the speed line is dimmed on a terminal

    history = [user(PARIS_QUESTION), {"role": "assistant", "content": first}, user(FOLLOW_UP)]
    shown, stats2 = t.turn(FOLLOW_UP + "\n")
    assert int(stats2[3]) == len(ref.tokens(history))
    assert int(stats2[4]) > 0, "the second turn reuses the first turn's keys and values"
    assert "Rome" in shown
    assert words(answer_text(shown, FOLLOW_UP + "\n"), 3) == words(ref.greedy(ref.tokens(history), 24), 3)

    # /clear forgets; a triple-quoted block is one message of two lines.
    t.send("/clear\n")
    t.read_until(r"Cleared the conversation\.")
    _, stats3 = t.turn('"""\nName the capital\nof France.\n"""\n')
    assert int(stats3[3]) == len(ref.tokens([user("Name the capital\nof France.")]))

    # Ctrl-C stops a long answer; the session goes on.
    start = len(t.out)
    t.send("Write a very long story about a dragon.\n")
    t.read_until(r"story about a dragon\.\r\n\S", start=start)
    t.send("\x03")
    t.read_until(r"kiri: stopped", start=start)
    t.read_until(r">>> ", start=start)

    t.send("/help\n")
    t.read_until(r"/clear ")
    t.send("/exit\n")
    assert t.wait() == 0


def test_chat_ends_at_ctrl_d(smollm2_instruct):
    t = Terminal(["chat", "-m", str(smollm2_instruct), "-n", "8"])
    t.read_until(r">>> ")
    t.send("\x04")
    assert t.wait() == 0


# ---- kiri chat with piped input ------------------------------------------------------------------------

def test_chat_with_piped_input(smollm2_instruct, ref):
    script = "%s\n%s\n/clear\nName the capital\\\nof France.\n" % (PARIS_QUESTION, FOLLOW_UP)
    r = run("chat", "-m", str(smollm2_instruct), "--temp", "0", "-n", "48", "-c", "1024", input=script)
    assert r.returncode == 0, r.stderr
    assert ">>>" not in r.stdout and "\x1b[" not in r.stdout + r.stderr   # no decoration off a terminal
    stats = [[int(float(x)) for x in m.groups()] for m in SPEED.finditer(r.stderr)]
    assert len(stats) == 3, r.stderr
    first = r.stdout.split("\n", 1)[0]
    assert "Paris" in first
    assert stats[0][3] == len(ref.tokens([user(PARIS_QUESTION)]))
    history = [user(PARIS_QUESTION), {"role": "assistant", "content": first}, user(FOLLOW_UP)]
    assert stats[1][3] == len(ref.tokens(history))
    assert "Rome" in r.stdout
    # After /clear, a line ending in a backslash continues the message on the next line.
    assert stats[2][3] == len(ref.tokens([user("Name the capital\nof France.")]))

    quiet = run("chat", "-m", str(smollm2_instruct), "--temp", "0", "-n", "8", "--no-stats", input="Hi\n")
    assert quiet.returncode == 0 and not SPEED.search(quiet.stderr) and quiet.stdout.strip()


def test_chat_forgets_the_oldest_turns_when_the_context_fills(smollm2_instruct, ref):
    questions = [PARIS_QUESTION, FOLLOW_UP, "And of Spain?", "And of Germany?"]
    r = run("chat", "-m", str(smollm2_instruct), "--temp", "0", "-n", "20", "-c", "100",
            input="".join(q + "\n" for q in questions))
    assert r.returncode == 0, r.stderr
    assert "too long for the context (100 tokens)" in r.stderr and "forgotten" in r.stderr
    stats = [[int(float(x)) for x in m.groups()] for m in SPEED.finditer(r.stderr)]
    answers = r.stdout.split("\n")[:len(questions)]
    assert len(stats) == len(questions) and all(stats[i][3] <= 100 - 20 for i in range(len(questions)))
    # The last prompt is the newest turns that fit, as jinja2 renders them.
    history = []
    for q, a in zip(questions, answers):
        history += [user(q), {"role": "assistant", "content": a}]
    history.pop()
    kept = [len(ref.tokens(history[i:])) for i in range(0, len(history), 2)]
    assert stats[-1][3] in kept[1:], (stats[-1], kept)


CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30},
                   "country": {"type": "string", "maxLength": 30},
                   "population": {"type": "integer"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


def json_values(text):
    """Every JSON value in text, one after the other (answers are separated by newlines)."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return values
        value, i = decoder.raw_decode(text, i)
        values.append(value)


def test_json_schema_constrains_run_and_chat(smollm2_instruct, tmp_path):
    schema = tmp_path / "city.json"
    schema.write_text(json.dumps(CITY_SCHEMA))
    for temp, seed in (("0", "0"), ("0.8", "7")):
        r = run("run", "-m", str(smollm2_instruct), "-p", "Name the capital of France, as JSON.",
                "--json-schema", str(schema), "--temp", temp, "--seed", seed, "-n", "120")
        assert r.returncode == 0, r.stderr
        jsonschema.validate(json.loads(r.stdout), CITY_SCHEMA)
    r = run("chat", "-m", str(smollm2_instruct), "--json-schema", str(schema), "--temp", "0", "-n", "120",
            input="%s\n%s\n" % (PARIS_QUESTION, FOLLOW_UP))
    assert r.returncode == 0, r.stderr
    answers = json_values(r.stdout)
    assert len(answers) == 2
    for a in answers:
        jsonschema.validate(a, CITY_SCHEMA)
    # What the compiler cannot honour is refused, naming the keyword.
    schema.write_text('{"type": "object", "patternProperties": {"a": {}}}')
    r = run("run", "-m", str(smollm2_instruct), "-p", "x", "--json-schema", str(schema))
    assert r.returncode == 1 and "patternProperties" in r.stderr


def test_chat_help_names_every_flag():
    r = run("chat", "--help")
    assert r.returncode == 0
    for flag in ("--system", "--n-predict", "--no-stats", "--temp", "--ctx-size", "--grammar", "--json-schema"):
        assert flag in r.stdout
    r = run("run", "--help")
    for flag in ("--system", "--raw", "--show-prompt", "--grammar", "--json-schema"):
        assert flag in r.stdout
