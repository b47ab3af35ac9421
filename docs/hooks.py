"""Build hooks (mkdocs): nothing yet."""
