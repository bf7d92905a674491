"""Offline stand-in for @rules_cc//cc:find_cc_toolchain.bzl."""

CPP_TOOLCHAIN_TYPE = "@bazel_tools//tools/cpp:toolchain_type"

def find_cc_toolchain(ctx):
    return ctx.toolchains[CPP_TOOLCHAIN_TYPE] if CPP_TOOLCHAIN_TYPE in ctx.toolchains else ctx.attr._cc_toolchain[cc_common.CcToolchainInfo]

def find_cpp_toolchain(ctx):
    return find_cc_toolchain(ctx)

def use_cpp_toolchain(mandatory = True):
    return [CPP_TOOLCHAIN_TYPE]
