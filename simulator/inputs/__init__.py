"""A scenario as the user gives it: the specs, model presets, Hugging Face import, framework
defaults, the rules that span sections and ``load_scenario`` (docs/architecture.md)."""
