"""Rendered commands and committed manifests checked against the engines' real parsers."""
