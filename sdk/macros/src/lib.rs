//! rill-sdk-macros: the `#[rill_sdk::transform]` attribute.
//!
//! It keeps the user's function as written (so native unit tests call it
//! directly) and, when compiling for WebAssembly, adds the component export of
//! the `rill:transform` world that feeds the function one record at a time.
//! Use it through `rill_sdk::transform`, not this crate directly.

use proc_macro::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::{Ident, ItemFn, Path, Token, parse_macro_input};

/// Options of the attribute: `init = path::to::fn`.
struct Args {
    init: Option<Path>,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Args> {
        let mut init = None;
        while !input.is_empty() {
            let name: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            if name == "init" {
                init = Some(input.parse::<Path>()?);
            } else {
                return Err(syn::Error::new(
                    name.span(),
                    format!(
                        "unknown option `{name}` of #[rill_sdk::transform]: the only option is `init = FUNCTION`"
                    ),
                ));
            }
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(Args { init })
    }
}

/// Marks `fn NAME(record: rill_sdk::Record) -> Result<O, E>` as the transform of
/// this crate, where `O` is `Output`, `Option<Output>`, `Vec<Output>` or `()` and
/// `E: Display`. `#[rill_sdk::transform(init = setup)]` also runs
/// `fn setup(&rill_sdk::Config) -> Result<(), E>` once per instance.
/// One crate exports one transform.
#[proc_macro_attribute]
pub fn transform(attr: TokenStream, item: TokenStream) -> TokenStream {
    let args = parse_macro_input!(attr as Args);
    let func = parse_macro_input!(item as ItemFn);
    if let Err(e) = check_signature(&func) {
        return e.to_compile_error().into();
    }
    let name = &func.sig.ident;
    let init = match &args.init {
        Some(path) => quote! { ::core::option::Option::Some(#path) },
        None => {
            quote! { ::core::option::Option::None::<fn(&::rill_sdk::Config) -> ::core::result::Result<(), ::std::string::String>> }
        }
    };
    let expanded = quote! {
        #func

        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct __RillTransform;

            impl ::rill_sdk::__private::bindings::Guest for __RillTransform {
                fn init(
                    config: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    ::rill_sdk::__private::init(config, #init)
                }

                fn process(
                    batch: ::rill_sdk::__private::bindings::rill::transform::types::InputBatch,
                ) -> ::rill_sdk::__private::bindings::rill::transform::types::OutputBatch {
                    ::rill_sdk::__private::process_batch(batch, #name)
                }
            }

            ::rill_sdk::__private::bindings::export_transform!(__RillTransform);
        };
    };
    expanded.into()
}

fn check_signature(func: &ItemFn) -> syn::Result<()> {
    let sig = &func.sig;
    if sig.asyncness.is_some() {
        return Err(syn::Error::new_spanned(
            sig.fn_token,
            "a transform function cannot be async: it handles one record and returns",
        ));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &sig.generics,
            "a transform function cannot be generic",
        ));
    }
    if sig.inputs.len() != 1 {
        return Err(syn::Error::new_spanned(
            &sig.inputs,
            "a transform function takes exactly one argument: `record: rill_sdk::Record`",
        ));
    }
    if matches!(sig.output, syn::ReturnType::Default) {
        return Err(syn::Error::new_spanned(
            sig,
            "a transform function returns Result<O, E> (O: Output, Option<Output>, Vec<Output> or (); E: Display)",
        ));
    }
    Ok(())
}
