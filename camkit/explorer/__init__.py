"""The explorer: camkit in the browser (gradio), on the user's own model, audits and evaluations."""
