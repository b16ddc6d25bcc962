;; Calls WASI functions a backend must not get anything useful from and
;; stores the results for the test: errno of path_open on fd 3, environ
;; count, args count, two clock readings, random bytes, fd_write to stdout,
;; sock_accept.
(module
  (import "wasi_snapshot_preview1" "path_open" (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $env (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $rand (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_prestat_get" (func $prestat (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "sock_accept" (func $accept (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 1024) "\52\4d\41\57\01\00\00\00\d0\02\00\00\00\00\00\00")
  (func (export "rmaw_abi_v1"))
  (func (export "rmaw_area") (result i32) i32.const 1024)
  ;; results at 2048: [0]=path_open errno [4]=environ count [8]=args count
  ;; [16]=clock0 [24]=clock1 [32..48]=random [48]=prestat errno [52]=accept errno
  (data (i32.const 3000) "/etc/passwd")
  (func (export "rmaw_init") (param i64) (result i64)
    (i32.store (i32.const 2048)
      (call $path_open (i32.const 3) (i32.const 0) (i32.const 3000) (i32.const 11) (i32.const 0)
        (i64.const -1) (i64.const -1) (i32.const 0) (i32.const 3100)))
    (drop (call $env (i32.const 2052) (i32.const 3200)))
    (drop (call $args (i32.const 2056) (i32.const 3204)))
    (drop (call $clock (i32.const 0) (i64.const 1) (i32.const 2064)))
    (drop (call $clock (i32.const 0) (i64.const 1) (i32.const 2072)))
    (drop (call $rand (i32.const 2080) (i32.const 16)))
    (i32.store (i32.const 2096) (call $prestat (i32.const 3) (i32.const 3300)))
    (i32.store (i32.const 2100) (call $accept (i32.const 3) (i32.const 0) (i32.const 3400)))
    i64.const 0)
)
