fn main() {
    // sqlx::migrate! embeds the migration files, but the compiler only
    // notices edits to files it already saw: rebuild when one is added.
    println!("cargo:rerun-if-changed=migrations");
}
