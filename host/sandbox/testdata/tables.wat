;; A table with no maximum (outside the memory cap). rmaw_init grows it to
;; 65536 elements (must work: the documented bound) and then by 2^20 more
;; (8 MiB; must return -1 once tables are bounded): status -3 if refused,
;; -4 if the first grow failed.
(module
  (memory (export "memory") 1)
  (table $t 1 funcref)
  (data (i32.const 1024) "\52\4d\41\57\01\00\00\00\d0\02\00\00\00\00\00\00")
  (func (export "rmaw_abi_v1"))
  (func (export "rmaw_area") (result i32) i32.const 1024)
  (func (export "rmaw_init") (param i64) (result i64)
    (if (i32.eq (table.grow $t (ref.null func) (i32.const 65535)) (i32.const -1))
      (then (return (i64.const -4))))
    (if (i32.eq (table.grow $t (ref.null func) (i32.const 1048576)) (i32.const -1))
      (then (return (i64.const -3))))
    i64.const 0)
)
