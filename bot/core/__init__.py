"""Pure, standard library only: facts, the log grammar, evidence, GPUs, the diagnosis, the verdict, the alert machine, humanize, redaction."""
