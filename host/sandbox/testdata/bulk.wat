;; plan_op runs one bulk instruction over its size argument, chosen by peer:
;; 1 memory.fill, 2 memory.copy, 3 memory.init (from a passive segment of
;; 64 KiB of zeros, size capped to it), 4 table.fill, 5 table.copy, 6 the
;; memory.fill in a loop forever, 7 table.grow. Memory: 32 MiB; table: 65536 elements.
(module
  (memory (export "memory") 512)
  (table $t 65536 funcref)
  (data (i32.const 1024) "\52\4d\41\57\01\00\00\00\d0\02\00\00\00\00\00\00")
  (data $zeros "")
  (func (export "rmaw_abi_v1"))
  (func (export "rmaw_area") (result i32) i32.const 1024)
  (func (export "rmaw_init") (param i64) (result i64) i64.const 1)
  (func (export "rmaw_plan_op") (param i32 i32 i32 i64 i32 i32) (result i32)
    (local $n i32)
    (local.set $n (i32.wrap_i64 (local.get 3)))
    (if (i32.eq (local.get 2) (i32.const 1))
      (then (memory.fill (i32.const 65536) (i32.const 0) (local.get $n))))
    (if (i32.eq (local.get 2) (i32.const 2))
      (then (memory.copy (i32.const 65536) (i32.const 65536) (local.get $n))))
    (if (i32.eq (local.get 2) (i32.const 3))
      (then (memory.init $zeros (i32.const 65536) (i32.const 0) (local.get $n))))
    (if (i32.eq (local.get 2) (i32.const 4))
      (then (table.fill $t (i32.const 0) (ref.null func) (local.get $n))))
    (if (i32.eq (local.get 2) (i32.const 5))
      (then (table.copy $t $t (i32.const 0) (i32.const 0) (local.get $n))))
    (if (i32.eq (local.get 2) (i32.const 6))
      (then (loop $l
        (memory.fill (i32.const 65536) (i32.const 0) (local.get $n))
        (br $l))))
    (if (i32.eq (local.get 2) (i32.const 7))
      (then (drop (table.grow $t (ref.null func) (local.get $n)))))
    (i32.store (i32.const 1040) (i32.const 0))
    i32.const 0)
)
