from setuptools import find_packages, setup

# templates/ and db/ live at the repository root (the design card's layout) and are installed inside the
# package as oasr_ops/templates and oasr_ops/db; oasr_ops.paths finds either location.
setup(
    name="oasr_ops",
    version="0.1.0",
    description="Per-shape, per-architecture CUTLASS GEMM selection from measured data, as torch ops",
    python_requires=">=3.10",
    packages=find_packages(include=["oasr_ops", "oasr_ops.*"]) + ["oasr_ops.templates", "oasr_ops.db"],
    package_dir={"oasr_ops.templates": "templates", "oasr_ops.db": "db"},
    package_data={"oasr_ops.templates": ["*.j2"], "oasr_ops.db": ["*/*.json", "README.md"]},
    install_requires=["torch>=2.11", "nvidia-cutlass==4.2.0.0", "jinja2", "filelock>=3.20.1",
                      "tqdm>=4.66"],  # progress bars (census, build, prebuild); on a terminal only
    extras_require={"test": ["pytest"], "plot": ["matplotlib"]},  # plot: `oasr tune evaluate --plot`
    entry_points={
        "console_scripts": ["oasr=oasr_ops.cli:main"],
        # The ONLY registration of backend="oasr" (a register_backend call as well would be a duplicate name).
        "torch_dynamo_backends": ["oasr = oasr_ops.inductor.backend:oasr_backend"],
    },
)
