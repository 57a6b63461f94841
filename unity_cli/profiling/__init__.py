"""``unity profile``: times operator pieces with the runtime's own kernels, and links and
collectives under MPI, and writes the profile the cost model reads (``cost.profile``).

It sits above the runtime, the plan and the search (it runs kernels, builds plans' graphs,
and starts MPI jobs), as the CLI does; nothing below imports it."""
