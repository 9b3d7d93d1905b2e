"""zo/_native.pyi, the type stub of the extension, names what the extension
defines: the same functions, classes, methods and properties, with the same
parameters. python/native_module.cc and the stub change together."""

import ast
import inspect
import os

import pytest

from zo import _native

STUB = os.path.join(os.path.dirname(_native.__file__), "_native.pyi")


def stub_tree():
    with open(STUB, encoding="utf-8") as f:
        return ast.parse(f.read())


def public(names):
    return {n for n in names if not n.startswith("_") or n == "__init__"}


def split_top_level(text):
    """Splits a pybind11 signature's parameter list at commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:])
    return [p.strip() for p in parts]


def native_parameters(function, name):
    """Parameter names from pybind11's signature line ("name(self: ..., a: int = 1) -> ...");
    positional-only ones come as arg0, arg1, ..."""
    line = function.__doc__.lstrip().splitlines()[0]
    assert line.startswith(name + "("), line
    inside = line[len(name) + 1:line.rindex(") ->")]
    return [p.split(":")[0].strip() for p in split_top_level(inside)]


def without_self(names):
    return names[1:] if names and names[0] == "self" else names


def assert_same_parameters(function, node, name):
    native = without_self(native_parameters(function, name))
    args = node.args
    stub = without_self([a.arg for a in args.posonlyargs + args.args + args.kwonlyargs])
    if all(n == f"arg{i}" for i, n in enumerate(native)):
        # Positional only in the extension (no py::arg): so in the stub, with "/".
        keyword = without_self([a.arg for a in args.args + args.kwonlyargs])
        assert len(stub) == len(native) and not keyword, \
            f"{name}: the extension takes {len(native)} positional-only parameters, " \
            f"the stub says {stub} (and {keyword} not positional only: write '/')"
    else:
        assert native == stub, f"{name}: the extension takes {native}, the stub says {stub}"


def assert_same_names(native, stubbed, what):
    assert native == stubbed, (
        f"{what}: python/native_module.cc and python/zo/_native.pyi differ: only in the "
        f"extension {sorted(native - stubbed)}, only in the stub {sorted(stubbed - native)}")


def test_the_stub_names_every_function_and_class_of_the_module():
    stubbed = {n.name for n in stub_tree().body
               if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    native = public(n for n in dir(_native) if not inspect.ismodule(getattr(_native, n)))
    assert_same_names(native, public(stubbed), "zo._native")


def test_functions_take_the_parameters_the_stub_says():
    for node in stub_tree().body:
        if isinstance(node, ast.FunctionDef):
            assert_same_parameters(getattr(_native, node.name), node, node.name)


@pytest.mark.parametrize("cls", ["Client", "EmbeddedServer"])
def test_classes_have_the_methods_and_properties_the_stub_says(cls):
    node = next(n for n in stub_tree().body if isinstance(n, ast.ClassDef) and n.name == cls)
    native = getattr(_native, cls)
    members = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
    assert_same_names(public(vars(native)), public(members), cls)
    for name, member in members.items():
        attr = vars(native)[name]
        is_property = any(isinstance(d, ast.Name) and d.id == "property"
                          for d in member.decorator_list)
        assert is_property == isinstance(attr, property), f"{cls}.{name}: property or method"
        if not is_property:
            assert_same_parameters(attr, member, name)
