"""Study CuTe's layout algebra on the CPU: layouts, the algebra, swizzles and banks, Hopper atoms.

`layout` (parse, evaluate, algebra through the DSL), `banks` (bank model, warp access patterns,
conflict counts), `draw` (SVG/PNG pictures), `atoms` (WGMMA/TMA layouts from the DSL helpers),
`cli` (the `cute-kernels layout|algebra|swizzle|atoms` subcommands).
"""
