"""Usage per customer: what each tenant's agent did each day (tasks, steps, compute, messages, effects, model
tokens, storage), collected from the instances' own tables into ``UsageDay`` rows an operator bills from."""
