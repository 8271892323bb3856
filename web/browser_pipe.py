"""A page in headless Chromium at real time, driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
Chromium reads commands from its fd 3 and writes answers to its fd 4, each a JSON object ended by a NUL byte).

web/browser_test.py reads most pages with --dump-dom under a virtual-time budget, where the page's clock stands still
while its scripts run; the time a check takes in the page is measured here instead, where the clock is the
machine's: results_at_real_time(url) opens the page, waits for the driver's results (web/browser_test_driver.js)
and returns them.
"""

import fcntl
import json
import os
import signal
import subprocess
import time


class PipeError(Exception):
    """Chromium ended, answered with an error, or ran past the time given."""


class Pipe:
    def __init__(self, chromium, timeout):
        self.deadline = time.monotonic() + timeout
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        args = ["nice", "-n", "10", chromium, "--headless=new", "--disable-gpu", "--no-first-run",
                "--remote-debugging-pipe", "about:blank"]
        if os.geteuid() == 0:
            args.insert(5, "--no-sandbox")

        def child_fds():  # the pipe's ends as fds 3 and 4 of Chromium, moved above 10 first so that neither clobbers
            high_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        # fds 3 and 4 kept open through the closing of the others, which comes after child_fds.
        self.process = subprocess.Popen(args, pass_fds=(3, 4), preexec_fn=child_fds,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.buffer, self.next_id = b"", 0

    def send(self, method, params=None, attached=None):
        """The answer's result to one command; events read on the way are dropped."""
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if attached:  # the page the command is for, by the id its attachment got
            message["sessionId"] = attached
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            answer = self.read()
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise PipeError(f"{method}: {answer['error']}")
                return answer["result"]

    def read(self):
        while b"\0" not in self.buffer:
            if time.monotonic() > self.deadline:
                raise PipeError("ran past the time given")
            chunk = os.read(self.from_browser, 1 << 16)
            if not chunk:
                raise PipeError("Chromium ended")
            self.buffer += chunk
        message, _, self.buffer = self.buffer.partition(b"\0")
        return json.loads(message)

    def close(self):
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        os.close(self.to_browser)
        os.close(self.from_browser)


# Waits for the driver's <pre id="tapegrad-test-results"> and gives its text.
WAIT_FOR_RESULTS = """new Promise((resolve) => {
  const look = () => {
    const out = document.getElementById("tapegrad-test-results");
    if (out) resolve(out.textContent); else setTimeout(look, 100);
  };
  look();
})"""


def results_at_real_time(chromium, url, timeout=300):
    """The driver's results of the page at url, run at real time."""
    pipe = Pipe(chromium, timeout)
    try:
        target = pipe.send("Target.createTarget", {"url": url})["targetId"]
        attached = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        while True:  # the first evaluations may run in about:blank, whose context the page's load ends
            try:
                value = pipe.send("Runtime.evaluate", {"expression": WAIT_FOR_RESULTS, "awaitPromise": True,
                                                       "returnByValue": True}, attached)
            except PipeError as e:
                if "context" not in str(e).lower():
                    raise
                time.sleep(0.2)
                continue
            if "exceptionDetails" not in value:
                break
            time.sleep(0.2)
        return json.loads(value["result"]["value"])
    finally:
        pipe.close()
