"""What the client scripts in this folder share: `@check(name)` runs the decorated function at
once and prints `ok: name` when it returns (an assertion that fails ends the script)."""


def check(name):
    def wrap(f):
        f()
        print(f"ok: {name}", flush=True)
        return f

    return wrap
