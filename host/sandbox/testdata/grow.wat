;; rmaw_init grows memory by the page count in the config's first byte
;; ('A' = 1 page ... ) - simpler: grows by 2048 pages (128 MiB) and reports
;; the result of memory.grow through a status: -3 (NOMEM) when refused.
(module
  (memory (export "memory") 1)
  (data (i32.const 1024) "\52\4d\41\57\01\00\00\00\d0\02\00\00\00\00\00\00")
  (func (export "rmaw_abi_v1"))
  (func (export "rmaw_area") (result i32) i32.const 1024)
  (func (export "rmaw_init") (param i64) (result i64)
    (if (i32.eq (memory.grow (i32.const 2048)) (i32.const -1))
      (then (return (i64.const -3))))
    i64.const 0)
)
